"""Signed fleet policies: who published a policy, not only that its bytes are whole.

A policy's card (`policies/<S>/<N>.json`) holds the sha256 of its text, so a card that
verifies vouches for the text.  Anyone who can write the store can write a card,
though: the sha256 proves integrity, not who published.  So `mlfs fleet train --key
FILE` writes a detached Ed25519 signature over the card's exact bytes next to it
(`<N>.sig`, 64 bytes), and `mlfs train --fleet URL --trusted-key PUB` installs only a
policy whose card a trusted key signed.  A key found in the store is never trusted:
trust comes from the operator's files only; with no trusted key nothing is installed.

The cryptography is `cryptography`'s (a well-kept binding of OpenSSL), not ours.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlfs.core.durable import write_durably

SIGNATURE_BYTES = 64


class SigningError(Exception):
    """A key that cannot be read or made (str() is one line)."""


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


def sign(card: bytes, key_file: Path) -> bytes:
    """The detached signature of `card` with the private key in `key_file`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningError(f"{key_file}: not an unencrypted Ed25519 private key "
                           f"({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{key_file}: not an Ed25519 key")
    return key.sign(card)


def load_trusted(files: list[str | Path]) -> list:
    """The operator's trusted public keys (SigningError naming a file that is not one)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    keys = []
    for name in files:
        try:
            key = serialization.load_pem_public_key(Path(name).read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise SigningError(f"{name}: not a public key ({type(exc).__name__})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningError(f"{name}: not an Ed25519 public key")
        keys.append(key)
    return keys


def signed_by(card: bytes, signature: bytes, trusted: list) -> bool:
    """True when one of the `trusted` keys signed exactly these card bytes."""
    from cryptography.exceptions import InvalidSignature

    if len(signature) != SIGNATURE_BYTES:
        return False
    for key in trusted:
        try:
            key.verify(signature, card)
            return True
        except InvalidSignature:
            continue
    return False
