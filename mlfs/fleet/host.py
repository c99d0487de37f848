"""The host as the fleet store knows it: its claim on its id, and the columns naming it.

Why a module of its own: what identifies a host in the store (`claims/<host>.json`, won by
a put-if-absent) and what of the host leaves with every row (`HOST_COLUMNS`, a private
subsystem's text masked by allow-list) are promises to the other hosts and to the people
on this one, kept apart from the pusher's mechanics (cursor, backoff, metrics) in
`push.py`, which calls `claim` once per run and `shipped_table` per portion.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pyarrow as pa

from mlfs.base.durable import read_bounded, write_durably

from .layout import HOST_COLUMNS
from .store import Store, StoreUnavailable, Unsupported, store_key


# ---- the claim on its id ------------------------------------------------------
class HostClash(ValueError):
    """Another machine or state directory already pushes as this host id (str(): one line)."""


#: where a host's claim on its id lives in the store (layout.py)
CLAIMS = "claims"


def _machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip()[:64]
    except OSError:
        return ""


def claim(store: Store, state_dir: Path, host: str, url: str) -> None:
    """Make sure this state directory is the one pushing as `host` into the store.

    The first push creates `claims/<host>.json` with a random token kept in the state
    directory (`fleet/claim-<store key>.json`, 0600), by the store's `put_if_absent`:
    two machines claiming one id at once cannot both win, as they could with a read
    followed by a write.  A later push with another token (a cloned VM image that copied
    `STATE/host`, a host configured with another's `host_id`) is refused with HostClash
    before it writes anything, so it never overwrites another host's objects or
    manifest.  A store with no conditional write (a generic fsspec URL) cannot hold a
    claim: HostClash says so, and nothing is pushed.
    """
    mine_path = Path(state_dir) / "fleet" / f"claim-{store_key(url)}.json"
    try:
        mine = json.loads(read_bounded(mine_path, 4096))
    except (OSError, ValueError):
        mine = None
    if not isinstance(mine, dict) or mine.get("host_id") != host:
        mine = {"host_id": host, "token": os.urandom(16).hex()}
        mine_path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(mine_path, json.dumps(mine).encode(), mode=0o600)
    target = f"{CLAIMS}/{host}.json"
    record = json.dumps({
        "host_id": host, "token": mine["token"], "machine_id": _machine_id(),
        "hostname": socket.gethostname(), "state_dir": str(state_dir),
        "claimed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode()
    try:
        if store.put_if_absent(target, record):
            return
    except Unsupported as exc:
        raise HostClash(f"cannot claim host id {host}: {exc}") from None
    try:
        theirs = json.loads(store.get(target, 4096))
    except FileNotFoundError:  # deleted between the two: the next pass claims again
        raise StoreUnavailable(f"{store.url}: {target} vanished while claiming") from None
    except ValueError as exc:
        raise HostClash(f"{target}: a damaged claim ({str(exc)[:100]}); not pushing as "
                        f"{host}") from None
    except OSError as exc:  # the store cannot be read now: a store failure, retried
        raise StoreUnavailable(f"{store.url}: cannot read {target}: {exc}") from None
    if isinstance(theirs, dict) and theirs.get("token") == mine["token"]:
        return
    who = theirs if isinstance(theirs, dict) else {}
    raise HostClash(
        f"host id {host} is claimed in the store by {str(who.get('hostname'))[:64]} "
        f"(machine {str(who.get('machine_id'))[:12]}, state {str(who.get('state_dir'))[:80]}"
        f", since {str(who.get('claimed'))[:20]}): a cloned image or a copied host_id? "
        "give this host its own id (docs/fleet.md, Hosts: mlfs umount, remove STATE/host "
        "and STATE/fleet/, mount again)")


# ---- the columns naming it --------------------------------------------------
def host_columns(mountpoint: Path) -> dict[str, str]:
    """The constant columns of every row this mount ships."""
    version = (mountpoint / "version").read_text().split()
    uname = os.uname()
    return {
        "host_id": (mountpoint / "host").read_text().strip(),
        "host_name": socket.gethostname(),
        "kernel_release": uname.release,
        "machine": uname.machine,
        "mlfs_version": version[-1] if version else "",
    }


def with_host_columns(table: pa.Table, host: dict[str, str]) -> pa.Table:
    for name in HOST_COLUMNS:
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, pa.array([host[name]] * table.num_rows, pa.string()))
    return table


def shipped_table(table: pa.Table, host: dict[str, str], private: bool) -> pa.Table:
    """A portion as it leaves the host: with the host columns, and for a private subsystem
    (the kernel log) its text masked by allow-list (`private_rows`) and the host known by
    its id only (a host name names a person's laptop as often as a server)."""
    if private:
        table = private_rows(table)
        host = {**host, "host_name": host["host_id"]}
    return with_host_columns(table, host)


def private_rows(table: pa.Table) -> pa.Table:
    """`table` with its text columns masked (`kernel_log.private_masked`, an allow-list):
    only the kernel's own words, symbols and typed placeholders leave the host."""
    from mlfs.kmsg import private_masked

    for name in PRIVATE_COLUMNS:
        if name in table.column_names:
            values = [None if v is None else private_masked(v)
                      for v in table.column(name).to_pylist()]
            index = table.column_names.index(name)
            table = table.set_column(index, name, pa.array(values, type=pa.string()))
    return table


#: the text columns of a private subsystem's rows that are masked before they ship
PRIVATE_COLUMNS = ("message", "signature", "dict_device")
