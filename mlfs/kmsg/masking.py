"""What of the kernel log may ship beyond the host: an allow-list of the kernel's words.

An allow-list, not a deny-list (red team K14: the deny-list shipped `Comm: alicejob`,
`UID: 1000 PID: 4242`, audit paths, IP and MAC addresses, SSIDs, USB serial numbers, NFS
server names, memcg paths with uids...).  First the places where the kernel's formats put
something of a user become typed placeholders (COMM, PID, UID, IP, MAC, PATH, SERIAL,
HOST, NAME); then every remaining word ships only if it is a word of the kernel's own
messages (`mlfs.kmsg.words`), a kernel symbol (a frame, a snake_case identifier), a
kernel source path, a block device or a placeholder; any other word becomes WORD.
"""

from __future__ import annotations

import re

from mlfs.kmsg import words as kernel_words
from mlfs.kmsg.records import printable

PLACEHOLDERS = frozenset({"COMM", "PID", "UID", "IP", "MAC", "PATH", "SERIAL", "HOST",
                          "NAME", "WORD", "ADDR", "NUM"})
_IN_CONTEXT: list[tuple[re.Pattern[str], str]] = [
    # a quoted value after a key of audit/AppArmor/SELinux: name="/srv/x" comm="job"
    (re.compile(r'\b(name|exe|path|cwd|root|dev|profile|scontext|tcontext|comm|cmd|'
                r'proctitle|subj|laddr|faddr|saddr|daddr|src|dst|hostname|addr)="[^"]*"'),
     "QUOTED"),
    (re.compile(r"\b(?:[0-9a-fA-F]{2}[:-]){5}[0-9a-fA-F]{2}\b"), "MAC"),
    (re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?(?![\w.])"), "IP"),
    # IPv6 (two colons at least; a PCI address 0000:00:19.0 is not one)
    # (NUM: a title the host already masked with `mask`)
    (re.compile(r"(?<![\w:.])(?:[0-9a-fA-F]|NUM){0,8}(?::(?:[0-9a-fA-F]|NUM){0,8}){2,7}"
                r"(?![\w:.])"), "IP"),
]
_COMM_PATTERNS = [
    # `CPU: 0 UID: 1000 PID: 4242 Comm: alicejob Tainted: ...` (show_regs, dump_stack)
    re.compile(r"(?P<k>\bComm: )(?P<v>.+?)(?= (?:Not tainted|Tainted:)|$)"),
    re.compile(r"(?P<k>\b(?:comm|task)[=: ]\"?)(?P<v>[^\",\s]+)"),
    re.compile(r"(?P<k>\bcomm )(?P<v>[^:\s]+)(?=:)"),                     # ext4: comm X:
    re.compile(r"(?P<k>^(?:traps: )?)(?P<v>\S.*?)(?=\[\d+\][: ])"),      # X[4242]: segfault
    re.compile(r"(?P<k>\bKilled process PID \()(?P<v>[^)]*)(?=\))"),
    re.compile(r"(?P<k>^)(?P<v>.+?)(?= invoked oom-killer)"),
    re.compile(r"(?P<k>\btask )(?P<v>.+?)(?=:\d+ blocked)"),
    re.compile(r"(?P<k>\[)(?P<v>[^\]\s:]+)(?=:\d+\]$)"),                 # [comm:4242]
    re.compile(r"(?P<k>\bin )(?P<v>[^\s\[]+)(?=\[[0-9a-fA-F]+\+)"),     # error 4 in X[7f..+
    re.compile(r"(?P<k>(?:segfault|fault|trap \w+) in )(?P<v>.+)$"),    # a title
    # the OOM killer's task table: [  pid  ]   uid  tgid total_vm rss ... name
    re.compile(r"(?P<k>^\[\s*\d+\]\s+\d+\s+\d+(?:\s+-?\d+){3,7}\s+)(?P<v>\S.*)$"),
]
_ID_PATTERNS = [
    (re.compile(r"(?P<k>\bKilled process )\d+"), "PID"),
    (re.compile(r"(?P<k>(?:COMM|^\S+)\[)\d+(?=\])"), "PID"),
    (re.compile(r"(?P<k>\[COMM:)\d+(?=\]$)"), "PID"),
    (re.compile(r"(?P<k>^\[)\s*\d+\]\s+\d+\s+\d+(?=\s)"), "PID] UID PID"),
    (re.compile(r"\b(?P<k>(?:[ap]?pid|tgid|ppid|sid|PID|TGID|pgid)[=:] ?)\d+"), "PID"),
    (re.compile(r"\b(?P<k>(?:[aefos]?uid|fsuid|[efos]?gid|fsgid|ouid|ogid|UID|GID)"
                r"[=:] ?)\d+"), "UID"),
    (re.compile(r"(?P<k>\buser-)\d+(?=\.slice)"), "UID"),
    (re.compile(r"(?P<k>\bSerialNumber: ?).*$"), "SERIAL"),
    (re.compile(r"(?P<k>\b(?:Product|Manufacturer|SSID|ssid|bssid|BSSID|label)[=:] ?)"
                r"(?:'[^']*'|\"[^\"]*\"|.*?)(?=,|$)"), "NAME"),
    (re.compile(r"(?P<k>\bserver )\S+"), "HOST"),
]
_PATH = re.compile(r"(?<![\w.])(?:/[^\s,;:'\"()\[\]]*)+")
#: kernel source trees: `mm/slub.c`, `fs/ext4/inode.c:123` ship as they are
_KERNEL_PATH = re.compile(r"^(?:arch|block|certs|crypto|drivers|fs|include|init|io_uring|"
                          r"ipc|kernel|lib|mm|net|rust|samples|security|sound|virt)/"
                          r"[\w/.+-]+$")
_DEVICE = re.compile(r"^(?:(?:sd|vd|hd|xvd)[a-z]{1,3}\d*|nvme\d+(?:n\d+)?(?:p\d+)?|"
                     r"loop\d+|dm-\d+|md\d+|nbd\d+|zram\d+|mmcblk\d+(?:p\d+)?|sr\d+|"
                     r"ata\d+(?:\.\d+)?|sd#|loop#|nvme#(?:n#)?)$")
_SYMBOL = re.compile(r"^[A-Za-z_][\w.]*\+0x[0-9a-f]+(?:/0x[0-9a-f]+)?$")
_SNAKE = re.compile(r"^_*[a-z][a-z0-9]*(?:_+[a-z0-9]+)+(?:\.(?:isra|constprop|part|cold|"
                    r"llvm)(?:\.\d+)?)*$")
#: a title of the kernel's own kinds ends with the kernel function it names
_KERNEL_TITLE = re.compile(r"^(?P<head>(?:WARNING|BUG|KASAN|KMSAN|KCSAN|KFENCE|UBSAN|INFO|"
                           r"general protection fault|kernel BUG|Oops)\b.* in )"
                           r"(?P<func>[A-Za-z_][\w.]*)$")
_UPPER_SNAKE = re.compile(r"^_*[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
#: network interfaces, Bluetooth and USB ports, kernel releases: the machine's, not a user's
_MACHINE = re.compile(r"^(?:(?:eth|wlan|wlp\w*|enp\w*|eno|ens|lo|br|bond|veth|virbr|tun|"
                      r"tap|hci|can|ib)\d*|\d+-\d+(?:\.\d+)*|\d+\.\d+[\w.+~-]*)$")
_HOSTLIKE = re.compile(r"^[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+$")
_WORDISH = re.compile(r"[^\s=,;:()\[\]{}<>\"'|]+")
_NUMBER = re.compile(r"^(?:0x)?[0-9a-fA-F]+$|^[+-]?\d+(?:\.\d+)?[a-zA-Z%]{0,3}$|^#\d+$")


def _word(m: re.Match[str]) -> str:
    token = m.group()
    core = token.strip(".!?-'`")
    if not core:
        return token
    if core in PLACEHOLDERS or _NUMBER.match(core):
        if re.fullmatch(r"(?:0x)?[0-9a-fA-F]{12,}", core):
            return token.replace(core, "ADDR")
        return token
    if len(core) == 1 or core.lower() in kernel_words.WORDS or _SNAKE.match(core) or \
            _SYMBOL.match(core) or _DEVICE.match(core) or _KERNEL_PATH.match(core) or \
            _UPPER_SNAKE.match(core) or _MACHINE.match(core):
        return token
    if all(part.lower() in kernel_words.WORDS or part in PLACEHOLDERS or
           _NUMBER.match(part) or _DEVICE.match(part)
           or len(part) == 1 for part in re.split(r"[-/+.#]", core) if part):
        return token  # total-vm, EXT4-fs, 0010:..., nvme0n1p1/...
    if _HOSTLIKE.match(core) and re.search(r"[A-Za-z]", core):
        return token.replace(core, "HOST")
    return token.replace(core, "WORD")


def private_masked(text: str) -> str:
    """`text` as it may leave the host: its skeleton in the kernel's own words, with every
    other word replaced by a typed placeholder (COMM, PID, UID, IP, MAC, PATH, SERIAL,
    HOST, NAME, WORD).  Applied to every message, title and device that leaves the host
    (the fleet store); the host itself keeps the record as the kernel wrote it (readable
    by root and the group only).  An allow-list: a word nobody thought of is not shipped.
    """
    text = printable(text)
    for pattern, kind in _IN_CONTEXT:
        if kind == "QUOTED":
            text = pattern.sub(lambda m: m.group(1) + '="' + (
                "COMM" if m.group(1) in ("comm", "cmd", "proctitle") else
                "IP" if m.group(1) in ("laddr", "faddr", "saddr", "daddr", "src", "dst",
                                      "addr") else
                "HOST" if m.group(1) == "hostname" else
                "NAME" if m.group(1) in ("profile", "subj", "scontext", "tcontext") else
                "PATH") + '"', text)
        else:
            text = pattern.sub(kind, text)
    text = _ID_PATTERNS[0][0].sub(r"\g<k>PID", text)  # before `Killed process PID (COMM)`
    for pattern in _COMM_PATTERNS:
        text = pattern.sub(lambda m: m.group("k") + "COMM", text)
    for pattern, kind in _ID_PATTERNS[1:]:
        text = pattern.sub(lambda m, kind=kind: m.group("k") + kind, text)
    text = _PATH.sub("PATH", text)  # absolute: a user's file (kernel sources are relative)
    m = _KERNEL_TITLE.match(text)  # `KASAN: ... in memcmp`: the function is the kernel's
    if m:
        return _WORDISH.sub(_word, m.group("head")) + m.group("func")
    return _WORDISH.sub(_word, text)
