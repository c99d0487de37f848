"""A mount's fleet host id: stable across restarts, kept in its state directory.

The fleet store (docs/fleet.md) partitions rows by host, and a host must stay
the same host across umount/mount, upgrades and reboots, or one machine's
history would split into many.  The machine's own identity (/etc/machine-id,
the host name) does not do: several mounts on one machine -- a test, a demo,
two devices tuned apart -- are several hosts.  So the id is minted once per
state directory, on its first mount, and written durably to `<state>/host`;
`[mount] host_id` overrides it (a fleet that names its hosts itself).

An id is a subsystem-style name (`[a-z0-9][a-z0-9._-]{0,63}`): safe as a hive
partition value (`host=<id>`) on every file system and object store.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from mlfs.abi import NAME, NAME_RULE
from mlfs.base.durable import set_aside, write_durably

log = logging.getLogger("mlfs.state")

HOST_FILE = "host"


def host_id_problem(value: object) -> str | None:
    """Why `value` cannot be a host id, or None when it can."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        return f"{value!r} is not a host id ({NAME_RULE})"
    return None


def host_id(state_dir: Path, configured: str = "") -> str:
    """The configured id, else the one in `<state>/host`, minted durably if absent.

    A damaged file (not a valid id) is set aside and a new id minted: the
    mount goes on, and the log says the host's identity changed.
    """
    if configured:
        return configured
    path = Path(state_dir) / HOST_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        set_aside(path, f"unreadable: {exc}")
        text = None
    if text is not None:
        if host_id_problem(text) is None:
            return text
        set_aside(path, host_id_problem(text) or "invalid")
    minted = secrets.token_hex(8)
    write_durably(path, (minted + "\n").encode("ascii"))
    log.info("fleet host id %s minted in %s", minted, path)
    return minted
