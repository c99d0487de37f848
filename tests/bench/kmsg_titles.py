"""Titles against syzkaller's: how often mlfs.crash names a crash as syzbot does.

    python -m tests.bench.kmsg_titles [--mismatches] [--json FILE]

Two corpora from syzkaller's pkg/report/testdata/linux (tests/data/syzkaller/README.md):

- linux-report/: console logs, each with the title (`TITLE:`) and corruption flag
  (`CORRUPTED: Y`) syzkaller's authors set by hand.  Measured: the title equals
  syzkaller's on the non-corrupted titled logs (a corrupted report's title is a guess
  by design), and the CORRUPTED flag agrees on all logs (no title means no report).
- linux-guilty/: reports each naming the source file to blame (`FILE:`).  Measured: the
  guilty file `mlfs.crash` names is that file.

`--mismatches` lists every case that differs, one per line, in the form of
tests/data/syzkaller/known_mismatches.txt, the list the unit suite
(tests/unit/test_crash_titles.py) holds to: a listed case must still differ, an unlisted
one must not.  The same case loader serves both.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from mlfs.crash import guilty_file, parse_log

CORPUS = Path(__file__).resolve().parents[1] / "data" / "syzkaller"
KNOWN_MISMATCHES = CORPUS / "known_mismatches.txt"


@dataclass(frozen=True)
class Case:
    """One golden file: its id (corpus/name), the log, and what syzkaller expects."""

    id: str
    log: str
    title: str = ""
    corrupted: bool = False
    guilty_file: str = ""


def _read(path: Path) -> tuple[dict[str, str], str]:
    """(header fields, log): syzkaller's layout, headers then a blank line then the log,
    which ends where an optional "REPORT:" section (the expected report text) begins."""
    text = path.read_bytes().decode("utf-8", errors="replace").replace("\r", "")
    head, _, log = text.partition("\n\n")
    log = log.split("\n\nREPORT:\n", 1)[0]
    fields: dict[str, str] = {}
    for line in head.splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith("#"):
            fields.setdefault(key, value)
    return fields, log


def _files(corpus: str) -> list[Path]:
    return sorted((CORPUS / corpus).iterdir(), key=lambda p: (len(p.name), p.name))


def report_cases() -> list[Case]:
    """Every log of linux-report/ with its expected title and CORRUPTED flag."""
    cases = []
    for path in _files("linux-report"):
        fields, log = _read(path)
        cases.append(Case(f"linux-report/{path.name}", log, fields.get("TITLE", ""),
                          fields.get("CORRUPTED") == "Y"))
    return cases


def guilty_cases() -> list[Case]:
    """Every report of linux-guilty/ with the file syzkaller blames."""
    return [Case(f"linux-guilty/{path.name}", log, guilty_file=fields["FILE"])
            for path in _files("linux-guilty") for fields, log in [_read(path)]]


def differences(case: Case) -> list[str]:
    """What mlfs.crash makes of `case` that syzkaller does not, as `what: want != got`.

    A title is compared only where syzkaller's is meant to be stable (a report it marks
    corrupted is titled by whatever survived); a guilty file only on the guilty corpus.
    """
    report = parse_log(case.log)
    out = []
    if case.id.startswith("linux-guilty/"):
        if report is None:
            return ["guilty: no report found"]
        # already symbolized: the report may repeat its title line, cutting it short
        text = report.text if case.log.endswith(report.text) else case.log
        got = guilty_file(report.title, text)
        if got != case.guilty_file:
            out.append(f"guilty: {case.guilty_file!r} != {got!r}")
        return out
    title = report.title if report else ""
    corrupted = report.corrupted if report else False
    if corrupted != case.corrupted:
        out.append(f"corrupted: {case.corrupted} != {corrupted}")
    if not case.corrupted and title != case.title:
        out.append(f"title: {case.title!r} != {title!r}")
    return out


def known_mismatches() -> dict[str, str]:
    """The checked-in list: case id -> the difference it is known for."""
    known = {}
    for line in KNOWN_MISMATCHES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            case_id, _, why = line.partition("  ")
            known[case_id.strip()] = why.strip()
    return known


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mismatches", action="store_true",
                        help="list every case that differs, as known_mismatches.txt lists them")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    started = time.monotonic()
    reports, guilty = report_cases(), guilty_cases()
    diffs = {case.id: differences(case) for case in reports + guilty}
    titled = [c for c in reports if c.title and not c.corrupted]
    title_ok = sum(not any(d.startswith("title") for d in diffs[c.id]) for c in titled)
    corrupted_ok = sum(not any(d.startswith("corrupted") for d in diffs[c.id]) for c in reports)
    guilty_ok = sum(not diffs[c.id] for c in guilty)
    results = {
        "titles_equal": round(title_ok / len(titled), 4), "titled_logs": len(titled),
        "corrupted_agrees": round(corrupted_ok / len(reports), 4), "logs": len(reports),
        "guilty_file_right": round(guilty_ok / len(guilty), 4), "guilty_logs": len(guilty),
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.mismatches:
        for case_id, found in diffs.items():
            if found:
                print(f"{case_id}  {'; '.join(found)}")
    print(f"titles equal syzkaller's on {title_ok}/{len(titled)} non-corrupted titled logs "
          f"({results['titles_equal']:.1%}); CORRUPTED agrees on {corrupted_ok}/{len(reports)} "
          f"({results['corrupted_agrees']:.1%}); guilty file right on {guilty_ok}/{len(guilty)} "
          f"({results['guilty_file_right']:.1%}); {results['seconds']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
