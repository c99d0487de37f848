"""Reports by signature: one `Report` per title, its file, and the bounded set kept.

A signature is a title in the spirit of syzbot's (`mlfs.kmsg.kinds`); its report keeps
how often and when it was seen and its first block whole.  `Reports` is the host's rule
and the fleet's: bounded per class (`BUDGETS`), a new signature the similarity
(`mlfs.kmsg.similarity`) puts in a known report counted there.
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass

from mlfs.kmsg.kinds import KINDS, guilty_file
from mlfs.kmsg.records import printable
from mlfs.kmsg.similarity import DUPLICATE_SIMILARITY, Similarity, similarity_text

#: reports of what the kernel wrote about itself: its own failures, which no user can
#: cause at will
KERNEL_KINDS = frozenset({"io_error", "fs_error", "oops", "bug", "warning", "panic",
                          "hung_task", "soft_lockup", "rcu_stall"})
#: reports any user can trigger at will (a process renaming itself and dereferencing
#: NULL every 0.2 s filled every slot in four minutes: red team K12)
USER_KINDS = frozenset({"segfault", "oom_kill"})
#: reports kept per class: a class full gives way within itself (its least recent
#: report goes, counted in `Reports.evicted`), never at the other's expense
BUDGETS = {"kernel": 384, "user": 128}
#: distinct reports kept per host
MAX_REPORTS = sum(BUDGETS.values())
#: signatures remembered as repeats of a kept report (each a short string pair)
MAX_ALIASES = 4 * MAX_REPORTS
#: lines of a report's first block kept
MAX_BLOCK_LINES = 200
#: a repeat of a known report is announced at most once per this many seconds
REPEAT_EVENT_SECONDS = 300.0
#: kinds that make a report (a line of `other` does not)
REPORTED_KINDS = frozenset(KINDS) - {"other", "lost"}


def report_class(kind: str, origin: str = "kernel") -> str:
    """The budget a report draws on: "kernel" for the kernel's own failures written by the
    kernel (facility 0), "user" for kinds users trigger and for whatever user space wrote
    into /dev/kmsg (the kernel gives such records facility `user`)."""
    return "kernel" if kind in KERNEL_KINDS and origin == "kernel" else "user"


def signature_id(kind: str, signature: str) -> str:
    """The report's file name: `<kind>-<first 12 hex of sha256(signature)>`."""
    return f"{kind}-{hashlib.sha256(signature.encode()).hexdigest()[:12]}"


@dataclass
class Report:
    """One signature: how often and when it was seen, and its first occurrence whole.

    `first_seen` and `last_seen` are the records' own times (wall clock, seconds), not
    the times mlfs read them."""

    id: str
    kind: str
    title: str
    count: int
    first_seen: float
    last_seen: float
    release: str
    host: str
    block: list[str]
    announced: float = 0.0
    budget: str = "kernel"
    #: the source file to blame (`guilty_file`), "" when the block names none
    guilty_file: str = ""

    def as_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "title": self.title, "count": self.count,
                "first_seen": self.first_seen, "last_seen": self.last_seen,
                "release": self.release, "host": self.host, "block": list(self.block),
                "budget": self.budget, "guilty_file": self.guilty_file}

    def text(self) -> str:
        """The report file: a header of `key: value` lines, a blank line, the block.

        Control characters are escaped (`printable`): `cat` of a report must not drive
        the reader's terminal."""
        import time as _time

        def when(t: float) -> str:
            return _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(t))

        head = [f"title: {printable(self.title)}", f"kind: {self.kind}",
                f"count: {self.count}", f"first_seen: {when(self.first_seen)}",
                f"last_seen: {when(self.last_seen)}", f"release: {self.release}",
                f"host: {printable(self.host)}"]
        if self.guilty_file:
            head.append(f"guilty_file: {printable(self.guilty_file)}")
        return "\n".join(head) + "\n\n" + "\n".join(printable(line) for line in self.block) \
            + "\n"

    @classmethod
    def from_text(cls, rid: str, text: str) -> Report:
        """The report a report file (`text()`) holds: the one reading of the one format,
        kept beside its writer (`mlfs reports` reads the mount's files through it)."""
        import calendar
        import time as _time

        head, _, block = text.partition("\n\n")
        fields = dict(line.partition(": ")[::2] for line in head.splitlines())

        def when(value: str) -> float:
            return float(calendar.timegm(_time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))

        count = fields.get("count", "0")
        return cls(rid, fields.get("kind", ""), fields.get("title", ""),
                   int(count) if count.isdigit() else 0, when(fields["first_seen"]),
                   when(fields["last_seen"]), fields.get("release", ""),
                   fields.get("host", ""), block.splitlines(),
                   guilty_file=fields.get("guilty_file", ""))


class Reports:
    """Reports by signature, bounded per class (`BUDGETS`): a new report in a full class
    evicts that class's least recently seen report (counted in `evicted`).

    The host's rule and the fleet's are this one class: `mlfs fleet reports` feeds every
    host's shipped occurrences through `seen` (with budgets for a fleet), so a bug is one
    report on a host and one line on the dashboard by the same signature and similarity."""

    def __init__(self, release: str, host: str, budgets: dict[str, int] | None = None) -> None:
        self.release = release
        self.host = host
        self.budgets = dict(BUDGETS if budgets is None else budgets)
        self.by_id: dict[str, Report] = {}
        #: per class, report ids from least to most recently seen
        self._recent: dict[str, collections.OrderedDict[str, None]] = {
            name: collections.OrderedDict() for name in BUDGETS}
        #: per class, reports that gave way to a newer one
        self.evicted: dict[str, int] = dict.fromkeys(BUDGETS, 0)
        self.similar: dict[str, Similarity] = {}  # per kind
        #: signature id -> the report it was found to repeat (bounded: `MAX_ALIASES`)
        self.aliases: collections.OrderedDict[str, str] = collections.OrderedDict()
        #: the last new-or-duplicate decision: (similarity, the report it is nearest to)
        self.last_similarity: tuple[float, str | None] = (0.0, None)

    @property
    def overflow(self) -> int:
        """Reports evicted so far, all classes."""
        return sum(self.evicted.values())

    def _similarity(self, kind: str) -> Similarity:
        similar = self.similar.get(kind)
        if similar is None:  # both classes may hold a kind (root writing a WARNING)
            similar = self.similar[kind] = Similarity(sum(self.budgets.values()))
        return similar

    def _touch(self, report: Report, when: float) -> None:
        report.count += 1
        report.first_seen = min(report.first_seen, when)
        report.last_seen = max(report.last_seen, when)
        self._recent[report.budget].move_to_end(report.id)

    def _evict(self, budget: str) -> None:
        rid, _ = self._recent[budget].popitem(last=False)
        report = self.by_id.pop(rid)
        self._similarity(report.kind).remove(rid)
        self.evicted[budget] += 1

    def _keep(self, report: Report, text: str) -> None:
        recent = self._recent[report.budget]
        while len(recent) >= self.budgets[report.budget]:
            self._evict(report.budget)
        self.by_id[report.id] = report
        recent[report.id] = None
        similar = self._similarity(report.kind)
        similar.add(report.id, text)

    def seen(self, kind: str, title: str, block: list[str], when: float,
             origin: str = "kernel") -> tuple[Report | None, str]:
        """Count one occurrence at `when` (the record's own time); returns (report,
        status): "new", "duplicate" (a new signature the learned similarity puts in a
        known report), "repeat" (rate-limited) or "quiet".  `origin` is "kernel" for a
        record the kernel wrote (facility 0), "user" for one user space wrote."""
        if kind not in REPORTED_KINDS:
            return None, "quiet"
        title = printable(title)
        rid = signature_id(kind, title)
        target = self.aliases.get(rid)
        if target is not None:
            if target in self.by_id:
                self.aliases.move_to_end(rid)
                rid = target
            else:  # its report gave way: the signature starts afresh
                del self.aliases[rid]
        report = self.by_id.get(rid)
        if report is None:
            similar = self._similarity(kind)
            text = similarity_text(title, block)
            nearest, score = similar.nearest(text)
            self.last_similarity = (score, nearest)
            if nearest is not None and score >= DUPLICATE_SIMILARITY:
                self.aliases[rid] = nearest
                if len(self.aliases) > MAX_ALIASES:
                    self.aliases.popitem(last=False)
                report = self.by_id[nearest]
                self._touch(report, when)
                return report, "duplicate"
            report = Report(rid, kind, title, 1, when, when, self.release, self.host,
                            list(block[:MAX_BLOCK_LINES]), announced=when,
                            budget=report_class(kind, origin), guilty_file=guilty_file(block))
            self._keep(report, text)
            return report, "new"
        self._touch(report, when)
        if when - report.announced >= REPEAT_EVENT_SECONDS:
            report.announced = when
            return report, "repeat"
        return report, "quiet"

    def to_json(self) -> list[dict]:
        return [r.as_dict() | {"announced": r.announced} for r in self.by_id.values()]

    def load(self, items: object) -> None:
        """Reports saved by `to_json`; entries that do not fit are skipped, and each class
        keeps its budget's most recent ones."""
        if not isinstance(items, list):
            return
        loaded = []
        for item in items[:4 * MAX_REPORTS]:
            try:
                report = Report(str(item["id"]), str(item["kind"]), printable(str(item["title"])),
                                int(item["count"]), float(item["first_seen"]),
                                float(item["last_seen"]), str(item["release"]),
                                str(item["host"]), [str(x) for x in item["block"]][
                                    :MAX_BLOCK_LINES],
                                float(item.get("announced", 0.0)))
                budget = str(item.get("budget", report_class(report.kind)))
                report.guilty_file = printable(str(item.get("guilty_file", "")))[:256]
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            report.budget = budget if budget in BUDGETS else report_class(report.kind)
            if report.kind in REPORTED_KINDS and report.id == signature_id(report.kind,
                                                                         report.title):
                loaded.append(report)
        for report in sorted(loaded, key=lambda r: r.last_seen):
            if report.id not in self.by_id:
                self._keep(report, similarity_text(report.title, report.block))
