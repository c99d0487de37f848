"""Fetching a fleet policy for one host: the newest (or a pinned) version whose
sha256 matches its card and which the policy verifier accepts.

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
from mlfs.core.verifier import verify

from .layout import POLICIES, policy_path, policy_version
from .push import Store

log = logging.getLogger("mlfs.fleet")


class PullError(Exception):
    """No usable fleet policy (str() says why, on one line)."""


@dataclass(frozen=True)
class FleetPolicy:
    version: int
    text: str
    card: dict


def _versions(store: Store, subsystem: str) -> list[int]:
    try:
        names = store.fs.ls(store.path(f"{POLICIES}/{subsystem}"), detail=False)
    except FileNotFoundError:
        return []
    found = [policy_version(n.rsplit("/", 1)[-1]) for n in names]
    return sorted((v for v, suffix in filter(None, found) if suffix == "json"), reverse=True)


def _checked(store: Store, subsystem: str, version: int) -> FleetPolicy:
    """The policy of `version`, or PullError saying why it is not usable."""
    try:
        card = json.loads(store.fs.cat_file(store.path(policy_path(subsystem, version, "json"))))
        data = store.fs.cat_file(store.path(policy_path(subsystem, version, "txt")))
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


def fetch(url: str, subsystem: str, version: int | None = None) -> FleetPolicy:
    """The pinned `version`, else the newest usable policy of `subsystem`."""
    store = Store(url)
    if version is not None:
        return _checked(store, subsystem, version)
    versions = _versions(store, subsystem)
    if not versions:
        raise PullError(f"{url}: no {POLICIES}/{subsystem}/<N>.json: nothing published yet")
    for candidate in versions:
        try:
            return _checked(store, subsystem, candidate)
        except PullError as exc:
            log.error("%s", exc)
    raise PullError(f"{url}: no usable {subsystem} policy among versions "
                    f"{', '.join(map(str, versions))}")
