"""Fetching a fleet policy for one host: the newest (or a pinned) version a trusted key
signed for this subsystem at this version number (mlfs/fleet/signing.py), whose
sha256 matches what was signed, which the policy verifier accepts, and which is not
older than the newest this host installed before.  Without a trusted key nothing is
installed.

Each version is checked in the order that bounds what a store writer can make a
host do: the listing first (a version without a `.sig` is skipped without a read),
then the `.sig` and the card, each a regular file read with a size limit (never
through a symlink, never blocking on a FIFO), the signature over the card's hash
before a byte of the card is parsed, then the policy text (bounded too) against the
signed sha256, then the verifier.  Versions that do not verify are counted and
logged once per fetch, not once each: 20,000 forged cards are one line.  The search
stops at the newest version that verifies.

Rollback: a host keeps a high-water mark per subsystem in its state directory
(`fleet-policies/<S>.json`: version, sha256, signer).  It never installs a version
older than the mark, nor the mark's version with another sha256 (a store whose
newest versions were deleted and published again).  An operator who wants an older
policy back deletes the mark (docs/fleet.md).

The card is written after the policy (mlfs/fleet/train.py), so a policy without a
card is not published yet and is never seen here.  What is fetched is uploaded to
the local model as any policy is, so the local proxy still verifies it, measures its
efficiency and decides its mode: a fleet policy bad on this host is demoted here
while other hosts keep it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from mlfs.base.durable import write_durably
from mlfs.base.errors import Refused
from mlfs.base.verifier import MAX_POLICY_BYTES

from .kinds import verify_policy
from .layout import POLICIES, policy_path, policy_version
from .signing import MAX_SIGNATURE_FILE_BYTES, BadSignature, check_policy, load_trusted
from .store import Store

log = logging.getLogger("mlfs.fleet")

#: a card is a few KB (per-host errors for a few hundred hosts at most)
MAX_CARD_BYTES = 1 << 20
#: the high-water marks, one file per subsystem, under the host's state directory
MARKS = "fleet-policies"
_SUBSYSTEM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}\Z")


class PullError(Exception):
    """No usable fleet policy (str() says why, on one line)."""


@dataclass(frozen=True)
class FleetPolicy:
    version: int
    text: str
    card: dict


def _listing(store: Store, subsystem: str) -> dict[int, set[str]]:
    """version -> the suffixes present, from one listing of the policy directory."""
    found: dict[int, set[str]] = {}
    names = store.list(f"{POLICIES}/{subsystem}/")
    for parsed in filter(None, (policy_version(n.rsplit("/", 1)[-1]) for n in names
                                if n.count("/") == 2)):
        found.setdefault(parsed[0], set()).add(parsed[1])
    return found



def _checked(store: Store, subsystem: str, version: int, trusted: list | None
             ) -> FleetPolicy:
    """The policy of `version`, or PullError saying why it is not usable.

    `trusted`: the operator's public keys (None: integrity only, for a publisher
    numbering its next version without a key)."""
    where = f"{subsystem} policy {version}"
    try:
        signed = None
        if trusted is not None:
            try:
                signature = store.get(policy_path(subsystem, version, "sig"),
                                      MAX_SIGNATURE_FILE_BYTES)
            except FileNotFoundError:
                raise PullError(f"{where}: unsigned (no {version:010d}.sig): skipped") from None
        card_bytes = store.get(policy_path(subsystem, version, "json"), MAX_CARD_BYTES)
        if trusted is not None:
            signed = check_policy(signature, subsystem, version, card_bytes, trusted)
        card = json.loads(card_bytes)
        if not isinstance(card, dict):
            raise ValueError("the card is not a JSON object")
        if card.get("subsystem") != subsystem or card.get("version") != version:
            raise ValueError(f"its card says {card.get('subsystem')} policy "
                             f"{card.get('version')}")
        if signed is not None and card.get("sha256") != signed.sha256:
            raise ValueError("its card's sha256 is not the one signed")
        data = store.get(policy_path(subsystem, version, "txt"), MAX_POLICY_BYTES)
    except FileNotFoundError as exc:
        missing = Path(exc.filename or "").name or "a file"
        raise PullError(f"{where}: {'unsigned' if missing.endswith('.sig') else 'incomplete'}"
                        f" (no {missing}): skipped") from None
    except BadSignature as exc:
        raise PullError(f"{where}: {exc}: skipped") from None
    except (OSError, ValueError) as exc:
        raise PullError(f"{where}: unreadable: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if card.get("sha256") != digest:
        raise PullError(f"{where}: sha256 {digest[:16]}... does not match its card; not used")
    try:
        verify_policy(card.get("kind"), data)
    except Refused as exc:
        raise PullError(f"{where}: refused by the verifier: {exc}") from exc
    return FleetPolicy(version, data.decode("ascii"), card)


def _newest(store: Store, subsystem: str, trusted: list | None) -> FleetPolicy | None:
    """The newest version that verifies, None when none does; the versions skipped on
    the way are logged in one line."""
    listing = _listing(store, subsystem)
    need = {"json", "sig"} if trusted is not None else {"json"}
    unsigned, skipped, first = 0, 0, None
    try:
        for version in sorted(listing, reverse=True):
            if not need <= listing[version]:
                unsigned += "json" in listing[version]
                continue
            try:
                return _checked(store, subsystem, version, trusted)
            except PullError as exc:
                skipped += 1
                first = first or str(exc)
        return None
    finally:
        if unsigned or skipped:
            log.warning("%s: skipped %d unsigned and %d unverifiable policy versions%s",
                        subsystem, unsigned, skipped, f" (newest: {first})" if first else "")


def newest_verified(store: Store, subsystem: str, trusted: list | None = None) -> int:
    """The newest version that verifies (by a `trusted` key, when given; else by its
    sha256 and its card's own version), 0 when none does: the next publish is one past
    it, so a forged or replayed 9999999999 never blocks the numbering."""
    found = _newest(store, subsystem, trusted)
    return found.version if found else 0


def _mark_path(state_dir: Path, subsystem: str) -> Path:
    return Path(state_dir) / MARKS / f"{subsystem}.json"


def installed_mark(state_dir: Path, subsystem: str) -> dict | None:
    """The newest fleet policy this host installed for `subsystem` (version, sha256,
    signer), None before the first.  A mark that cannot be read stops the install
    (PullError): without it, any older signed version would pass."""
    try:
        mark = json.loads(_mark_path(state_dir, subsystem).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PullError(f"{_mark_path(state_dir, subsystem)}: unreadable high-water mark "
                        f"({exc}); nothing installed (delete it to start over)") from None
    if not (isinstance(mark, dict) and isinstance(mark.get("version"), int)
            and isinstance(mark.get("sha256"), str)):
        raise PullError(f"{_mark_path(state_dir, subsystem)}: malformed high-water mark; "
                        "nothing installed (delete it to start over)")
    return mark


def _record(state_dir: Path, subsystem: str, policy: FleetPolicy) -> None:
    path = _mark_path(state_dir, subsystem)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_durably(path, (json.dumps({"version": policy.version,
                                         "sha256": policy.card["sha256"],
                                         "signer": policy.card.get("signer")}) + "\n").encode())
    except OSError as exc:
        raise PullError(f"{path}: cannot record the installed version "
                        f"({exc.strerror or exc}); nothing installed") from None


def fetch(url: str, subsystem: str, version: int | None = None,
          trusted_keys: list | None = None, state_dir: Path | None = None) -> FleetPolicy:
    """The pinned `version`, else the newest usable policy of `subsystem` that one of the
    operator's `trusted_keys` (files) signed; with none, nothing (PullError; a key file
    refused for its mode or type: SigningError).

    With `state_dir`, the host's high-water mark there refuses anything older than what
    it installed before, and moves up to what is returned."""
    if not trusted_keys:
        raise PullError("no trusted key (--trusted-key): no fleet policy is installed, "
                        "whoever wrote the store")
    if not _SUBSYSTEM.match(subsystem):
        raise PullError(f"{subsystem!r}: not a subsystem name")
    trusted = load_trusted(trusted_keys)
    store = Store(url)
    if version is not None:
        found = _checked(store, subsystem, version, trusted)
    else:
        found = _newest(store, subsystem, trusted)
        if found is None:
            raise PullError(f"{url}: no {subsystem} policy a trusted key signed")
    if state_dir is not None:
        mark = installed_mark(state_dir, subsystem)
        if mark is not None and (found.version < mark["version"] or (
                found.version == mark["version"] and found.card["sha256"] != mark["sha256"])):
            raise PullError(
                f"{subsystem} policy {found.version} (sha256 {found.card['sha256'][:16]}...) "
                f"does not come after policy {mark['version']} (sha256 {mark['sha256'][:16]}"
                f"...), which this host installed already: a rollback, refused (the mark is "
                f"{_mark_path(state_dir, subsystem)})")
        _record(state_dir, subsystem, found)
    return found
