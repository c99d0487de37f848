"""Fetching a fleet policy for one host: the newest (or a pinned) version whose card a
trusted key signed (mlfs/fleet/signing.py), whose sha256 matches its card, and which
the policy verifier accepts.  Without a trusted key nothing is installed; an unsigned
or untrusted version is skipped with a log line, as a tampered one is.

The card is written after the policy (mlfs/fleet/train.py), so a policy
without a card is not published yet and is never seen here.  A policy whose
bytes do not hash to the card's sha256 (a torn copy, an edit, a store that
served the wrong object) is never used: with a pinned version that is an
error; otherwise it is logged and the next older version is tried.  What is
fetched is uploaded to the local model as any policy is, so the local proxy
still verifies it, measures its efficiency and decides its mode: a fleet
policy bad on this host is demoted here while other hosts keep it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

from mlfs.core.errors import Refused
from mlfs.core.verifier import MAX_POLICY_BYTES, verify

from .layout import (
    MAX_DOCUMENT_BYTES,
    MAX_SIGNATURE_BYTES,
    POLICIES,
    policy_path,
    policy_version,
)
from .signing import SigningError, load_trusted, signed_by
from .store import Store

log = logging.getLogger("mlfs.fleet")


class PullError(Exception):
    """No usable fleet policy (str() says why, on one line)."""


@dataclass(frozen=True)
class FleetPolicy:
    version: int
    text: str
    card: dict


def _versions(store: Store, subsystem: str) -> list[int]:
    names = store.list(f"{POLICIES}/{subsystem}/")
    found = [policy_version(n.rsplit("/", 1)[-1]) for n in names if n.count("/") == 2]
    return sorted((v for v, suffix in filter(None, found) if suffix == "json"), reverse=True)


def newest_verified(store: Store, subsystem: str, trusted: list | None = None) -> int:
    """The newest version whose card verifies (sha256, and a trusted signature when
    `trusted` is given), 0 when none: the next publish is one past it, so a forged
    version (9999999999 with an invented card) never blocks the numbering."""
    for version in _versions(store, subsystem):
        try:
            _checked(store, subsystem, version, trusted)
            return version
        except PullError as exc:
            log.warning("numbering past %s", exc)
    return 0


def _checked(store: Store, subsystem: str, version: int, trusted: list | None
             ) -> FleetPolicy:
    """The policy of `version`, or PullError saying why it is not usable.

    `trusted`: the operator's public keys (None: integrity only, for the publisher
    numbering its next version without a key)."""
    try:
        card_bytes = store.get(policy_path(subsystem, version, "json"), MAX_DOCUMENT_BYTES)
        if trusted is not None:
            try:
                signature = store.get(policy_path(subsystem, version, "sig"),
                                      MAX_SIGNATURE_BYTES)
            except FileNotFoundError:
                raise PullError(f"{subsystem} policy {version}: unsigned (no {version:010d}.sig)"
                                ": skipped") from None
            if not signed_by(card_bytes, signature, trusted):
                raise PullError(f"{subsystem} policy {version}: not signed by a trusted key: "
                                "skipped")
        card = json.loads(card_bytes)
        data = store.get(policy_path(subsystem, version, "txt"), MAX_POLICY_BYTES)
    except (OSError, ValueError) as exc:
        raise PullError(f"{subsystem} policy {version}: unreadable: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if not isinstance(card, dict) or card.get("sha256") != digest:
        raise PullError(f"{subsystem} policy {version}: sha256 {digest[:16]}... does not match "
                        "its card; not used")
    try:
        verify(data)
    except Refused as exc:
        raise PullError(f"{subsystem} policy {version}: refused by the verifier: {exc}") from exc
    return FleetPolicy(version, data.decode("ascii"), card)


def fetch(url: str, subsystem: str, version: int | None = None,
          trusted_keys: list | None = None) -> FleetPolicy:
    """The pinned `version`, else the newest usable policy of `subsystem` that one of the
    operator's `trusted_keys` (files) signed; with none, nothing (PullError)."""
    if not trusted_keys:
        raise PullError("no trusted key (--trusted-key): no fleet policy is installed, "
                        "whoever wrote the store")
    try:
        trusted = load_trusted(trusted_keys)
    except SigningError as exc:
        raise PullError(str(exc)) from None
    store = Store(url)
    if version is not None:
        return _checked(store, subsystem, version, trusted)
    versions = _versions(store, subsystem)
    if not versions:
        raise PullError(f"{url}: no {POLICIES}/{subsystem}/<N>.json: nothing published yet")
    for candidate in versions:
        try:
            return _checked(store, subsystem, candidate, trusted)
        except PullError as exc:
            log.error("%s", exc)
    raise PullError(f"{url}: no usable {subsystem} policy among versions "
                    f"{', '.join(map(str, versions))}")
