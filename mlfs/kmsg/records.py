"""Records of the kernel's log, read the way the kernel writes them.

A read(2) of /dev/kmsg returns one record (Documentation/ABI/testing/dev-kmsg):
``PRIORITY,SEQ,TS_USEC,FLAGS[,...];MESSAGE`` where PRIORITY is ``facility << 3 | level``,
SEQ the record's 64-bit sequence number (it restarts at boot), TS_USEC the monotonic time
of the record in microseconds, FLAGS ``-`` or ``c``/``+`` (continuation), then
continuation lines `` KEY=value`` (the dictionary: ``SUBSYSTEM=block``,
``DEVICE=b7:3``).  Non-printable bytes of the message arrive escaped as ``\\xNN``;
`printable` escapes them again for whatever prints a message on a terminal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: syslog facility numbers (the kernel's records are 0; `user` is 1)
FACILITY_KERNEL, FACILITY_USER = 0, 1
#: the longest message kept in a row (the kernel's own limit is about 1 KiB)
MAX_MESSAGE = 2048


@dataclass
class Record:
    """One /dev/kmsg record."""

    seq: int
    ts_usec: int
    level: int
    facility: int
    continuation: bool
    message: str
    fields: dict[str, str] = field(default_factory=dict)


def parse_record(raw: bytes) -> Record | None:
    """One read(2) of /dev/kmsg as a Record; None when it is not in the kernel's format.

    The kernel escapes every byte below 0x20 (but tab) and from 0x7f up as ``\\xNN``; those
    are bytes of the UTF-8 the writer meant, so they are unescaped as bytes and the result
    decoded as UTF-8 (an invalid sequence stays visible as ``\\xNN``): ``é`` comes back as
    ``é``, not as the two characters of mojibake a per-byte ``chr`` made (red team K3).
    Control characters are restored too (the message is the kernel's); what prints a
    title or a report escapes them (`printable`).
    """
    head, sep, rest = raw.partition(b";")
    if not sep:
        return None
    parts = head.decode("ascii", errors="replace").split(",")
    if len(parts) < 4 or not all(p.isdigit() for p in parts[:3]):
        return None
    prio, seq, ts = int(parts[0]), int(parts[1]), int(parts[2])
    lines = rest.split(b"\n")
    message = _unescape(lines[0])[:MAX_MESSAGE]
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith(b" ") and b"=" in line:
            key, _, value = line[1:].partition(b"=")
            if len(fields) < 16:
                fields[_unescape(key)[:32]] = _unescape(value)[:256]
    return Record(seq=seq, ts_usec=ts, level=prio & 7, facility=prio >> 3,
                  continuation=parts[3] in ("c", "+"), message=message, fields=fields)


_ESCAPED = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(data: bytes) -> str:
    if b"\\x" in data:
        data = _ESCAPED.sub(lambda m: bytes((int(m.group(1), 16),)), data)
    return data.decode("utf-8", errors="backslashreplace")


#: C0 and C1 controls, DEL, and the bidirectional overrides that reorder what a terminal
#: shows (a title is printed by `mlfs reports`; a raw ESC there sets the terminal's title
#: or clears its screen: red team K2)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with control characters escaped as the kernel escapes them (``\\x1b``), as
    dmesg prints them: safe to print on a terminal."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                       else f"\\u{ord(m.group()):04x}"), text)
