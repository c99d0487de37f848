"""Signed fleet policies: who published a policy, and for which subsystem and version.

A policy's card (`policies/<S>/<N>.json`) holds the sha256 of its text, so a card that
verifies vouches for the text.  Anyone who can write the store can write a card,
though: the sha256 proves integrity, not who published.  So `mlfs fleet train --key
FILE` writes a detached Ed25519 signature next to the card (`<N>.sig`), and `mlfs
train --fleet URL --trusted-key PUB` installs only a policy a trusted key signed.  A
key found in the store is never trusted: trust comes from the operator's files only;
with no trusted key nothing is installed.

What is signed (format 2) is a short text naming everything a host acts on:

    mlfs-policy-signature 2
    subsystem sim.readahead
    version 3
    sha256 <the policy text's sha256>
    card-sha256 <the card's sha256>
    signer <key id: the first 16 hex digits of the sha256 of the raw public key>

and the `.sig` file is that text plus a last line `signature <base64>`.  A host
rebuilds the subsystem and version from the path it read, so a signed policy copied
under another number (a rollback, F2; the last number, F3) or another subsystem's
directory (F4) no longer verifies.  Format 1 signed the card's bytes alone (a 64-byte
`.sig`); the card named its version and subsystem but no host compared them, and
every such signature can be replayed anywhere, so format 1 is refused, with a line
saying to publish again: accepting it would keep the hole open for as long as one
old signed file exists anywhere.

Key files are read as ssh reads them: never through a symlink, a private key
readable by nobody but its owner, a public key writable by nobody but its owner,
owned by the user or root (SigningError, one line, otherwise).

The cryptography is `cryptography`'s (a well-kept binding of OpenSSL), not ours.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mlfs.base.durable import write_durably

SIGNATURE_BYTES = 64
FORMAT = 2
_MAGIC = f"mlfs-policy-signature {FORMAT}"
_FIELDS = ("subsystem", "version", "sha256", "card-sha256", "signer")
#: a format-2 `.sig` is about 300 bytes; anything larger is not one (read no further)
MAX_SIGNATURE_FILE_BYTES = 1024
#: a PEM key is a few hundred bytes
_MAX_KEY_BYTES = 64 << 10


class SigningError(Exception):
    """A key that cannot be read, trusted or made (str() is one line)."""


class BadSignature(Exception):
    """A `.sig` that does not vouch for this card at this path (str() says why)."""


@dataclass(frozen=True)
class Signed:
    """What a verified signature vouches for."""

    sha256: str
    signer: str


def key_id(public_key) -> str:
    """A short, stable name for a public key (the card and the signed text carry it)."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _read_key_file(path: Path, private: bool) -> bytes:
    """The bytes of a key file, refused (SigningError) when its mode, owner or type lets
    someone else choose the key: ssh's StrictModes, for the same reason."""
    what = "private key" if private else "trusted public key"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SigningError(f"{path}: {what} is a symlink; refused (keys are read only "
                               "from regular files, as ssh reads them)") from None
        raise SigningError(f"{path}: cannot read the {what}: "
                           f"{exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningError(f"{path}: {what} is not a regular file; refused")
        mode = stat.S_IMODE(st.st_mode)
        if private and mode & 0o077:
            raise SigningError(f"{path}: private key mode {mode:04o} lets group or other "
                               f"read it; refused (chmod 600 {path})")
        if not private and mode & 0o022:
            raise SigningError(f"{path}: trusted public key mode {mode:04o} lets group or "
                               f"other replace it; refused (chmod go-w {path})")
        if st.st_uid not in (0, os.geteuid()):
            raise SigningError(f"{path}: {what} is owned by uid {st.st_uid}, neither root "
                               "nor you; refused")
        if st.st_size > _MAX_KEY_BYTES:
            raise SigningError(f"{path}: {st.st_size} bytes is no {what}; refused")
        return os.read(fd, _MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)


def keygen(path: Path) -> Path:
    """A new Ed25519 key: PATH (private, PEM, 0600) and PATH.pub (public, PEM); the
    public one's path.  Refuses to overwrite an existing key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    public = path.with_name(path.name + ".pub")
    for target in (path, public):
        if os.path.lexists(target):  # a dangling link too (red-team F7)
            raise SigningError(f"{target} exists: a key is never overwritten")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private_pem)
    if not write_durably(public, key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
            exclusive=True):
        raise SigningError(f"{public} appeared meanwhile: a key is never overwritten")
    return public


def load_private(key_file: Path):
    """The Ed25519 private key in `key_file` (SigningError when it is not one, or when
    its file is a symlink or readable by group or other)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key_file(Path(key_file), private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{key_file}: not an unencrypted Ed25519 private key "
                           f"({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{key_file}: not an Ed25519 key")
    return key


def signed_text(subsystem: str, version: int, sha256: str, card: bytes, signer: str) -> bytes:
    """The exact bytes a format-2 signature covers."""
    values = (subsystem, str(version), sha256, hashlib.sha256(card).hexdigest(), signer)
    lines = [_MAGIC] + [f"{name} {value}" for name, value in zip(_FIELDS, values, strict=True)]
    return ("\n".join(lines) + "\n").encode("ascii")


def sign_policy(key_file: Path, subsystem: str, version: int, sha256: str,
                card: bytes) -> bytes:
    """The `.sig` file binding `card` to `subsystem`, `version`, the policy's `sha256`
    and the signer."""
    key = load_private(key_file)
    text = signed_text(subsystem, version, sha256, card, key_id(key.public_key()))
    return text + b"signature " + base64.b64encode(key.sign(text)) + b"\n"


def check_policy(sig_file: bytes, subsystem: str, version: int, card: bytes,
                 trusted: list) -> Signed:
    """What `sig_file` vouches for, when a `trusted` key signed `card` as the policy
    `version` of `subsystem` (the path's, never the card's own say); BadSignature
    otherwise.  Nothing of the card is parsed: call this first."""
    from cryptography.exceptions import InvalidSignature

    if not sig_file.startswith(_MAGIC.encode() + b"\n"):
        if len(sig_file) == SIGNATURE_BYTES:
            raise BadSignature("signed in format 1 (over the card alone, which binds neither "
                               "version nor subsystem): refused; publish it again with "
                               "mlfs fleet train --key")
        raise BadSignature("not an mlfs policy signature")
    lines = sig_file.split(b"\n")
    if len(lines) != len(_FIELDS) + 3 or lines[-1] != b"":
        raise BadSignature("malformed signature file")
    try:
        fields = dict(line.decode("ascii").split(" ", 1) for line in lines[1:-1])
        signature = base64.b64decode(fields.pop("signature"), validate=True)
    except (UnicodeDecodeError, ValueError, KeyError, binascii.Error):
        raise BadSignature("malformed signature file") from None
    if tuple(fields) != _FIELDS or len(signature) != SIGNATURE_BYTES:
        raise BadSignature("malformed signature file")
    if (fields["subsystem"], fields["version"]) != (subsystem, str(version)):
        raise BadSignature(f"signed as {fields['subsystem']} policy {fields['version']}, "
                           f"found as {subsystem} policy {version}: a replayed copy, refused")
    text = signed_text(subsystem, version, fields["sha256"], card, fields["signer"])
    if fields["card-sha256"] != hashlib.sha256(card).hexdigest():
        raise BadSignature("the card is not the one signed")
    for key in trusted:
        if key_id(key) != fields["signer"]:
            continue
        try:
            key.verify(signature, text)
        except InvalidSignature:
            break
        return Signed(fields["sha256"], fields["signer"])
    raise BadSignature(f"not signed by a trusted key (signer {fields['signer']})")


def load_trusted(files: list[str | Path]) -> list:
    """The operator's trusted public keys (SigningError naming a file that is not one,
    or one whose mode, owner or type would let someone else replace it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    keys = []
    for name in files:
        data = _read_key_file(Path(name), private=False)
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise SigningError(f"{name}: not a public key ({type(exc).__name__})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningError(f"{name}: not an Ed25519 public key")
        keys.append(key)
    return keys
