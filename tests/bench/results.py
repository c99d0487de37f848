"""The results, rebuilt from the raw outputs archived in bench-results/.

The raw outputs of every experiment (JSON, logs, Parquet, scripts) are kept out of docs/, one
xz-compressed tar archive per experiment in bench-results/ (bench-results/README.md); every
figure of the full table in docs/results/README.md and of README's headlines comes from an
archive git tracks (an untracked one is not read); a row whose raw output is not archived
says so instead of quoting a figure.  The tuning experiments are scored by the one rule
(`scoring.overall`: equal work per phase, the harmonic mean of the per-phase ratios to the
interleaved default), whatever rule their run printed: the dirty-ratio, writeback and queue
runs' JSON keep each condition's per-phase ratios (``ratio`` -> condition -> phase), and
their stored "overall" (before issue 33 a time-weighted arithmetic mean) is not read.

Per experiment: the ratio to the default and to the best static value where it has them
(median [min–max] over runs), the share of the oracle's gain (`scoring.oracle_share`, per
run, median), the worst phase, the number of runs (a claim on one run says so), the command
and a link to its page.

    python -m tests.bench.results            # rewrite the results page and README's headlines
    python -m tests.bench.results --check    # exit 1 and print a diff if either differs
    python -m tests.bench.results --print    # the full table alone, to stdout
    python -m tests.bench.results --pack /tmp/dirty-win-20   # archive a new run's outputs
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.bench import against_fixed, scoring

ROOT = Path(__file__).resolve().parents[2]
#: the lab: one compressed archive per experiment, outside docs/ (bench-results/README.md)
LAB = "bench-results"
#: the results pages (Markdown only); the index holds the full table
PAGES = "docs/results"
INDEX = f"{PAGES}/README.md"
BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
HEAD_BEGIN = "<!-- headlines:begin -->"
HEAD_END = "<!-- headlines:end -->"
FIXED_BEGIN = "<!-- fixed:begin -->"
FIXED_END = "<!-- fixed:end -->"
NONE = "–"
NO_OUTPUT = "**no committed output**"
#: loose outputs of one experiment share a prefix (readahead-win-seed1.json and
#: readahead-win-4a9757a.log are both readahead-win's); a run's folder is its own
EXPERIMENTS = ("attacks", "bio-capture", "demo-predict", "dirty-sweep", "efficiency",
               "exchange-full", "failing-modes", "failing-predict", "fleet-coldstart", "fleet-cost",
               "fleet-demo", "fleet-quality", "fleet-scale", "kmsg-dedup", "kmsg-rates",
               "loading", "parked-readers", "predict-fleet-cold-start", "predict-sim-disks",
               "queue-sweep", "readahead-win", "records-ingest", "writeback-sweep")


@dataclass
class Row:
    experiment: str  # markdown, with the link to its page
    measured: str
    result: str
    vs_default: str = NONE
    vs_best: str = NONE
    oracle_share: str = NONE
    worst_phase: str = NONE
    runs: str = NONE
    command: str = NONE

    def cells(self) -> list[str]:
        return [self.experiment, self.measured, self.result, self.vs_default, self.vs_best,
                self.oracle_share, self.worst_phase, self.runs, self.command]


HEADER = ["experiment", "what was measured", "result", "× default", "× best static",
          "of the oracle's gain", "worst phase", "runs", "command"]


# ---- reading the committed archives --------------------------------------------------------
def experiment_of(member: str) -> str:
    """The experiment (the archive's name) a raw output belongs to: the prefix in
    EXPERIMENTS its first path component starts with, else that component itself (a run's
    folder: `dirty-win-12`)."""
    top = member.split("/", 1)[0]
    for name in sorted(EXPERIMENTS, key=len, reverse=True):
        if top == name or top.startswith((name + "-", name + ".")):
            return name
    return top if "/" in member else top.rsplit(".", 1)[0]


def archive_of(member: str) -> str:
    return f"{LAB}/{experiment_of(member)}.tar.xz"


class Outputs:
    """The raw outputs in the archives git tracks under bench-results/ (all of them where
    git is unavailable; an untracked archive is not read).  A raw output is named by its
    member path, its path once its archive is unpacked into bench-results/
    (`learning-34/latest.json`, `readahead-win-seed1.json`)."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self._members: dict[str, dict[str, bytes]] = {}
        self._where: dict[str, str] = {}  # member -> the archive it was found in
        try:
            listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", LAB],
                                    capture_output=True, check=True).stdout
            self.tracked: set[str] | None = {p for p in listed.decode().split("\0") if p}
        except (OSError, subprocess.CalledProcessError):
            self.tracked = None

    def archives(self) -> list[str]:
        found = sorted(str(p.relative_to(self.root))
                       for p in (self.root / LAB).glob("*.tar.xz"))
        return [p for p in found if self.tracked is None or p in self.tracked]

    def members(self, archive: str) -> dict[str, bytes]:
        """An archive's files in the order they were added (oldest first); only JSON and
        text are read, the rest (Parquet, nested archives) is listed with no content."""
        if archive not in self._members:
            got: dict[str, bytes] = {}
            if archive in self.archives():
                with tarfile.open(self.root / archive, "r:xz") as tar:
                    for info in tar:
                        if not info.isfile():
                            continue
                        text = info.name.endswith((".json", ".txt", ".log"))
                        got[info.name] = tar.extractfile(info).read() if text else b""
                        self._where.setdefault(info.name, archive)
            self._members[archive] = got
        return self._members[archive]

    def _archive(self, rel: str) -> str:
        """The archive of `rel`: its experiment's, or (found by `glob`) an older archive
        of many runs (dirty-win-1-11.tar.xz)."""
        home = archive_of(rel)
        return home if rel in self.members(home) else self._where.get(rel, home)

    def exists(self, rel: str) -> bool:
        return rel in self.members(self._archive(rel))

    def read(self, rel: str) -> str:
        return self.members(self._archive(rel))[rel].decode()

    def json(self, rel: str):
        return json.loads(self.read(rel))

    def glob(self, pattern: str) -> list[str]:
        """Members matching `pattern` (fnmatch; `*` stays within one path component)."""
        depth = pattern.count("/")
        return sorted({m for a in self.archives() for m in self.members(a)
                       if m.count("/") == depth and fnmatch.fnmatchcase(m, pattern)})

    def newest(self, folder: str, accept: Callable[[object], bool]) -> str | None:
        """`folder`/latest.json if archived, else the JSON added last to the folder (its
        archive keeps the order git committed the files it was packed from) that
        `accept`s."""
        if self.exists(f"{folder}/latest.json"):
            return f"{folder}/latest.json"
        order = [m for m in self.members(archive_of(f"{folder}/x"))
                 if m.startswith(folder + "/") and m.endswith(".json")]
        for rel in reversed(order):
            if accept(self.json(rel)):
                return rel
        return None


# ---- packing raw outputs into the lab -----------------------------------------------------
def _git_order(root: Path, paths: Sequence[Path]) -> dict[Path, int]:
    """Each file's last commit time (absent if git does not know it)."""
    try:
        log = subprocess.run(["git", "-C", str(root), "log", "--format=@%ct", "--name-only",
                              "--", *map(str, paths)], capture_output=True, check=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    when, seen = 0, {}
    for line in log.splitlines():
        if line.startswith("@"):
            when = int(line[1:])
        elif line and (root / line).resolve() not in seen:
            seen[(root / line).resolve()] = when
    return seen


def pack(sources: Sequence[Path], root: Path = ROOT) -> list[str]:
    """Add the files under each source (a run's folder or a loose output) to its
    experiment's archive in bench-results/, after the members already there, which keep
    their place (the last added is the newest; files git knows go in commit order, new
    ones last).  Members are named relative to the source's parent; a member already
    archived is replaced where it stands."""
    touched: dict[str, list[tuple[str, Path]]] = {}
    for src in map(Path.resolve, sources):
        files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
        for f in files:
            name = f.relative_to(src.parent).as_posix()
            touched.setdefault(archive_of(name), []).append((name, f))
    for archive, new in touched.items():
        order = _git_order(root, [f for _, f in new])
        new.sort(key=lambda nf: (order.get(nf[1], 2**62), nf[0]))
        path = root / archive
        kept: dict[str, bytes] = {}
        if path.exists():
            with tarfile.open(path, "r:xz") as tar:
                kept = {i.name: tar.extractfile(i).read() for i in tar if i.isfile()}
        for name, f in new:
            kept[name] = f.read_bytes()
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tarfile.open(tmp, "w:xz", preset=9) as tar:
            for name, data in kept.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
        tmp.replace(path)
    return sorted(touched)


# ---- formatting ---------------------------------------------------------------------------
def spread(values: Sequence[float], fmt: str = "{:.2f}", prefix: str = "×") -> str:
    """median [min–max], or the value alone for one run."""
    med = statistics.median(values)
    if len(values) == 1:
        return prefix + fmt.format(med)
    return (f"{prefix}{fmt.format(med)} [{fmt.format(min(values))}–"
            f"{fmt.format(max(values))}]")


def percent(values: Sequence[float]) -> str:
    vals = [v for v in values if v == v]  # nan: an oracle that gains nothing
    if not vals:
        return NONE
    med = statistics.median(vals)
    if len(vals) == 1:
        text = f"{med:.0%}"
    else:
        text = f"{med:.0%} [{min(vals):.0%}–{max(vals):.0%}]"
    return text.replace("%", " %").replace("-", "−")


def runs_cell(n: int, unit: str = "run", note: str = "") -> str:
    text = f"{n} {unit}{'s' if n != 1 else ''}"
    if n == 1:
        text = f"**one {unit} only**"
    return text + (f"; {note}" if note else "")


def lab(member: str) -> str:
    """A link from the results pages to the archive that holds `member`."""
    return f"[{member}](../../{archive_of(member)})"


def missing(experiment: str, measured: str, claim: str, command: str) -> Row:
    return Row(experiment, measured, f"{NO_OUTPUT}: the figures once quoted here ({claim}) "
               "are backed by no file in bench-results/", runs=NONE, command=command)


# ---- the interleaved fio experiments (fio_win.py: dirty, writeback, queue) -----------------
def fio_run_scores(run: dict) -> dict:
    """One fio_win run, rescored by the one rule from its per-phase ratios."""
    phases = run["phases"]
    mlfs = {p: run["ratio"]["mlfs"][p] for p in phases}
    best = {p: run["ratio"]["best static"][p] for p in phases}
    m, b = scoring.overall(mlfs), scoring.overall(best)
    oracle = run["sweep"]["analysis"]["oracle_overall"]  # the sweep's: already the rule
    return {"mlfs": m, "best": b, "vs_best": m / b if b else 0.0, "oracle": oracle,
            "share": scoring.oracle_share(m, oracle), "phases": mlfs,
            "printed": run["ratio"]["mlfs"]["overall"]}


def run_name(rel: str) -> str:
    """dirty-win-15/run2.json: 15-2; queue-win/run1.json: 1."""
    folder, run = Path(rel).parent.name, Path(rel).stem.removeprefix("run")
    return f"{folder.rsplit('-', 1)[-1]}-{run}" if folder[-1].isdigit() else run


def fio_rows(out: Outputs, folders: Sequence[str]) -> list[tuple[str, dict]]:
    rows = []
    for folder in folders:
        runs = out.glob(f"{folder}/run*.json")
        runs.sort(key=lambda p: int(Path(p).stem.removeprefix("run")))
        for p in runs:
            data = out.json(p)
            rows.append((run_name(p), {**fio_run_scores(data), "date": data.get("date"),
                                        "commit": data.get("commit")}))
    return rows


def measured_when(scores: Sequence[dict]) -> str:
    """The runs' dates and commits (outputs before issue 33 record no commit)."""
    days = sorted({s["date"].split()[0] for s in scores if s.get("date")})
    commits = sorted({s["commit"] for s in scores if s.get("commit")})
    at = f"at {', '.join(commits)}" if commits else "commit not recorded"
    if not days:
        return f"date not recorded, {at}"
    span = days[0] if len(days) == 1 else f"{days[0]} – {days[-1]}"
    return f"{span}, {at}"


def worst_phase(scores: Sequence[dict]) -> str:
    phases = list(scores[0]["phases"])
    by = {p: [s["phases"][p] for s in scores] for p in phases}
    worst = min(phases, key=lambda p: statistics.median(by[p]))
    return f"{worst} {spread(by[worst])}"


def fio_row(out: Outputs, experiment: str, page: str, measured: str, folders: Sequence[str],
            command: str, note: str = "", subsets: dict[str, Sequence[str]] | None = None
            ) -> Row:
    got = fio_rows(out, folders)
    if not got:
        return missing(experiment, measured, "", command)
    scores = [s for _, s in got]
    names = ", ".join(n for n, _ in got)
    result = (f"mlfs {spread([s['mlfs'] for s in scores])} the default, equal work per "
              f"phase (run{'s' if len(got) > 1 else ''} {names}); the sweep's oracle "
              f"{spread([s['oracle'] for s in scores])}")
    for label, members in (subsets or {}).items():
        part = [s for n, s in got if n in members]
        if part:
            result += (f"; {label} ({', '.join(members)}): {spread([s['mlfs'] for s in part])}"
                       f" the default, {spread([s['vs_best'] for s in part])} the best static")
    if note:
        result += f"; {note}"
    return Row(f"{experiment} ([page]({page}))", measured, result,
               vs_default=spread([s["mlfs"] for s in scores]),
               vs_best=spread([s["vs_best"] for s in scores]),
               oracle_share=percent([s["share"] for s in scores]),
               worst_phase=worst_phase(scores),
               runs=runs_cell(len(scores), note=measured_when(scores)), command=command)


# ---- the experiments ----------------------------------------------------------------------
def learning(out: Outputs) -> Row:
    folder = "learning-34"
    rel = out.newest(folder, lambda d: isinstance(d, list) and bool(d)
                     and "second_half" in d[0])
    measured = "sim.readahead, virtual time, second half of each run"
    if rel is None:
        return missing("learning loop", measured, "", "python -m tests.bench.learning")
    seeds = out.json(rel)
    half = [s["second_half"] for s in seeds]
    of_oracle = [h["vs_oracle"] for h in half]
    vs_default = [h["vs_default"] for h in half]
    vs_best = [h["vs_best_static"] for h in half]
    # the oracle's own ratio to the default, per seed: vs_default / vs_oracle
    share = [scoring.oracle_share(h["vs_default"], h["oracle"] / h["default"]) for h in half]
    ticks = [s["ticks_to_recommendation"] for s in seeds]
    reached = [t for t in ticks if t is not None]
    below = sum(v < 1 for v in vs_default)
    ids = sorted(s["seed"] for s in seeds)
    ticks_text = (f"median {statistics.median(reached):,.0f} ticks to recommendation"
                  if reached else "no seed reached recommendation")
    if len(reached) < len(ticks):
        ticks_text += f" ({len(reached)} of {len(ticks)} reached it)"
    result = (f"**{statistics.median(of_oracle):.3f}** of the oracle (median; worst "
              f"{min(of_oracle):.3f}); {ticks_text}; "
              + ("none below the default" if not below else
                 f"{below} seed{'s' if below > 1 else ''} below the default")
              + f" ({Path(rel).name})")
    return Row(f"learning loop ([{folder}.md]({folder}.md))",
               f"{measured}, {seeds[0]['ticks']:,} ticks, seeds {ids[0]}–{ids[-1]}", result,
               vs_default=spread(vs_default, "{:.3f}"), vs_best=spread(vs_best, "{:.3f}"),
               oracle_share=percent(share),
               runs=f"{len(seeds)} seeds, virtual time; " + (
                   f"at {seeds[0]['commit']}" if seeds[0].get("commit")
                   else f"at {Path(rel).stem}" if re.fullmatch(r"[0-9a-f]{7,40}",
                                                                Path(rel).stem)
                   else "commit not recorded"),
               command=f"`python -m tests.bench.learning --ticks {seeds[0]['ticks']} "
                       f"--seeds {ids[0]} … {ids[-1]}`")


READAHEAD = ("readahead-win.json", "readahead-win-seed1.json", "readahead-win-seed2.json")


def readahead_scores(data: dict) -> dict:
    """One readahead_win run (3 interleaved repeats): per-phase medians, the one rule."""
    results = data["results"]
    cond = {k.split(" (")[0]: v for k, v in results.items()}
    phases = [p for p in cond["default"][0]["mib_per_s"] if p != "overall"]
    med = {c: {p: statistics.median(r["mib_per_s"][p] for r in runs) for p in phases}
           for c, runs in cond.items()}
    mlfs = scoring.phase_ratios(med["mlfs"], med["default"], phases)
    best = scoring.phase_ratios(med["best static"], med["default"], phases)
    sweep = data["sweep"]
    default_kb = next(k for k in results if k.startswith("default")).split("(")[1].rstrip(")")
    ref = sweep[default_kb]
    oracle = scoring.overall({p: max(row[p] for row in sweep.values()) / ref[p]
                              for p in phases})
    m, b = scoring.overall(mlfs), scoring.overall(best)
    return {"mlfs": m, "best": b, "vs_best": m / b, "oracle": oracle,
            "share": scoring.oracle_share(m, oracle), "phases": mlfs,
            "best_kb": data["best"], "repeats": len(cond["mlfs"])}


def newest_readahead_runs(out: Outputs) -> list[str]:
    """readahead-win-<commit>.json: the runs that name the commit they measured."""
    return sorted(r for r in out.glob("readahead-win-*.json")
                  if re.fullmatch(r"readahead-win-[0-9a-f]{7,40}", Path(r).stem))


def readahead(out: Outputs, newest: bool = False) -> Row:
    """The three runs of unrecorded date and commit, or (`newest`) the runs since, each
    named readahead-win-<commit>.json."""
    if newest:
        rels = newest_readahead_runs(out)
    else:
        rels = [f for f in READAHEAD if out.exists(f)]
    measured = "a loop device, three phases, application MiB/s"
    command = ("`python -m tests.bench.readahead_win --json readahead-win-COMMIT.json` "
               "(as root)" if newest else
               "`python -m tests.bench.readahead_win` (as root; `--seed 1`, `--seed 2`)")
    if not rels:
        return missing("read-ahead on a real device", measured, "", command)
    scores = [readahead_scores(out.json(r)) for r in rels]
    best_kb = sorted({str(s["best_kb"]) for s in scores})
    each = ", ".join(f"×{s['mlfs']:.2f}" for s in scores)
    result = (f"mlfs {each} the default, equal "
              f"work per phase; best static by sweep {', '.join(best_kb)} KiB; the sweep's "
              f"oracle {spread([s['oracle'] for s in scores])}")
    return Row("read-ahead on a real device ([history](history.md))", measured,
               result, vs_default=spread([s["mlfs"] for s in scores]),
               vs_best=spread([s["vs_best"] for s in scores]),
               oracle_share=percent([s["share"] for s in scores]),
               worst_phase=worst_phase(scores),
               runs=runs_cell(len(scores), note=f"{scores[0]['repeats']} interleaved "
                              "repeats each; " + (
                                  "at " + ", ".join(Path(r).stem.rsplit("-", 1)[1]
                                                    for r in rels) if newest
                                  else "date and commit not recorded")),
               command=command)


#: the first dirty-win-N folder of today's protocol (checkpoint + tempfiles, 30 s visits,
#: the objective over 3 fio reports: the sixth try); every later folder is counted
DIRTY_FIRST = 12


def dirty_folders(out: Outputs) -> list[str]:
    numbers = {int(Path(p).parent.name.rsplit("-", 1)[1])
               for p in out.glob("dirty-win-*/run*.json")}
    return [f"dirty-win-{n}" for n in sorted(numbers) if n >= DIRTY_FIRST]


def dirty(out: Outputs) -> list[Row]:
    page = "dirty-ratios.md"
    measured = "checkpoint + tempfiles phases, 30 s visits"
    folders = dirty_folders(out)
    if not folders:
        return [missing("dirty ratios on fio workloads", measured, "",
                        "`python -m tests.bench.dirty_win` (as root)")]
    rows = [fio_row(out, "dirty ratios on fio workloads", page, measured, folders,
                    "`python -m tests.bench.dirty_win` (as root)",
                    note="each run on the estimate's and trainer's rules of its day",
                    subsets={"the balanced estimate live": ("14-1", "15-1", "15-2")})]
    newest = folders[-1]
    first = out.glob(f"{newest}/run*.json")[0]
    rows.append(fio_row(out, f"dirty ratios, the newest run folder ({newest})", page,
                        measured, [newest],
                        f"`{fio_command('dirty', out.json(first)['args'])}` (as root)"))
    return rows


def fio_command(candidate: str, args: dict) -> str:
    """The command line that gives a run's options with today's defaults."""
    from tests.bench.fio_win import parse_args

    quick = bool(args.get("quick"))
    defaults = vars(parse_args(candidate, ["--quick"] if quick else []))
    words = [f"python -m tests.bench.{candidate}_win"] + (["--quick"] if quick else [])
    for key, value in args.items():
        if key in ("quick", "verbose", "candidate") or key not in defaults:
            continue
        if value == defaults[key] or value is None:
            continue
        if isinstance(value, list | tuple):
            shown = ",".join(value)
        elif isinstance(value, float):
            shown = f"{value:g}"
        else:
            shown = str(value)
        words.append(f"--{key.replace('_', '-')} {shown}")
    return " ".join(words)


def fleet_coldstart(out: Outputs) -> Row:
    rel = "fleet-coldstart-virtual.json"
    measured = "a newcomer from a fleet policy vs learning alone"
    command = "`python -m tests.bench.fleet_coldstart`"
    if not out.exists(rel):
        return missing("fleet cold start", measured, "", command)
    v = out.json(rel)["virtual"]["summary"]
    f, a = v["fleet"]["ticks_to_recommendation"], v["alone"]["ticks_to_recommendation"]
    n = int(f["reached"].split("/")[1])
    result = (f"{f['median']:,} [{f['range'][0]:,}–{f['range'][1]:,}] vs {a['median']:,} "
              f"[{a['range'][0]:,}–{a['range'][1]:,}] ticks to recommendation (virtual "
              f"time, median; reached {f['reached']} / {a['reached']})")
    real = "fleet-coldstart.json"
    if out.exists(real):
        s = out.json(real)["summary"]
        rf, ra = s["fleet"]["ticks_to_recommendation"], s["alone"]["ticks_to_recommendation"]
        result += (f"; on real mounts {rf['median']:,.0f} vs {ra['median']:,.0f} "
                   f"({rf['reached']} seeds)")
    return Row("fleet cold start ([fleet-coldstart.md](fleet-coldstart.md))",
               measured, result, runs=f"{n} seeds", command=command)


#: the demo's own summary line, as it prints it
_FLEET_DEMO = re.compile(r"newcomer vs alone \(seed (?P<seed>\d+)\): ticks to recommendation "
                         r"mode (?P<new>\S+) vs (?P<alone>\S+); second half (?P<qn>[\d.]+) vs "
                         r"(?P<qa>[\d.]+) of the oracle")


def fleet_demo(out: Outputs) -> Row:
    measured, command = "`mlfs demo --fleet 2` on this 2-core machine", "`mlfs demo --fleet 2`"
    outputs = out.glob("fleet-demo-*.txt")
    runs = [(rel, _FLEET_DEMO.search(out.read(rel))) for rel in outputs]
    runs = [(rel, m) for rel, m in runs if m]
    if not runs:
        return missing("fleet demo", measured,
                       "311 s; newcomer in recommendation at tick 460 against 1,332 alone, "
                       "0.984 of the oracle against 0.934", command)
    result = "; ".join(
        f"newcomer from the fleet policy in recommendation at tick {m['new']} against "
        f"{m['alone']} learning alone, {m['qn']} against {m['qa']} of the oracle (second "
        f"half, seed {m['seed']}; {lab(rel)})" for rel, m in runs)
    return Row("fleet demo", measured, result,
               runs=f"{len(runs)} run{'s' if len(runs) > 1 else ' only'}", command=command)


def alarms(n: int) -> str:
    return f"{n} false alarm{'' if n == 1 else 's'}"


def predict(out: Outputs) -> Row:
    rel = "predict-sim-disks.json"
    command = "`python -m tests.bench.predict`"
    if not out.exists(rel):
        return missing("drive failure prediction", "sim.disks", "", command)
    d = out.json(rel)
    pooled = d["pooled"]
    smart, learned = pooled["smart_threshold"], pooled["learned_at_smart_threshold_rate"]
    low = pooled.get("learned_at_1e-05")
    ratio = learned["recall"] / smart["recall"]
    # deployable: the threshold chosen on the validation seed lands at its own rate on the
    # test seeds; the curve reads every model at exactly the rule's test rate
    result = (f"at SMART's false-alarm rate, threshold chosen on a validation seed: recall "
              f"{learned['recall']:.3f} at {alarms(learned['false_alarms'])} vs the "
              f"threshold's {smart['recall']:.3f} at {alarms(smart['false_alarms'])} "
              f"(×{ratio:.2f})")
    curve = d.get("curve", {})
    at_rate = curve.get("learned_at_smart_threshold_rate", {}).get("pooled")
    offline = curve.get("offline_at_smart_threshold_rate", {}).get("pooled")
    if at_rate and offline:
        same = at_rate["recall"] / smart["recall"]
        of_offline = at_rate["recall"] / offline["recall"]
        result += (f"; read at exactly its rate: {at_rate['recall']:.3f} (×{same:.2f}, target "
                   f"×2 {'met' if same >= 2 else '**not met**'}), ×{of_offline:.2f} the "
                   f"offline model's (target ≥ ×0.95 "
                   f"{'met' if of_offline >= 0.95 else '**not met**'})")
    if low:
        result += f"; at 1e-5 false alarms per drive-day {low['recall']:.2f}"
    return Row("drive failure prediction ([predictors.md](../predictors.md))",
               f"sim.disks, {smart['events']} failures on {len(d['seeds'])} unseen seeds",
               result, runs=f"**one run** ({len(d['seeds'])} seeds)", command=command)


def failing_predict(out: Outputs) -> Row:
    rel = "failing-predict.json"
    command = "`python -m tests.bench.failing_predict --train 6 --test 3` (as root)"
    measured = "the project's failing disk under a loop device, schedules the training never saw"
    if not out.exists(rel):
        return missing("failure prediction on a real failing disk", measured, "", command)
    d = out.json(rel)
    ran = d.get("args", {})  # the archived run's own arguments, where it kept them
    if "train" in ran and "test" in ran:
        command = (f"`python -m tests.bench.failing_predict --train {ran['train']} "
                   f"--test {ran['test']}` (as root)")

    def said(source: str) -> str:
        leads = [r[source]["lead_s"] for r in d["runs"]]
        return (f"lead {', '.join('–' if v is None else f'{v:g}' for v in leads)} s, "
                f"{d[source]['false_alarms']} false alarm(s)")

    result = (f"learned: {said('model')}; alert after the first error (the default rule): "
              f"{said('first_error')}; a rate threshold: {said('rate')}")
    gate = d.get("gate")  # the proxy's rule gate (`predictor.beats`), since issue 53
    if gate:
        result += ("; the model beats the rule: recommendation" if gate["model_beats_incumbent"]
                   else "; the model does not beat the rule: it stays in collaboration")
    return Row("failure prediction on a real failing disk "
               "([predictors.md](../predictors.md))", measured, result,
               runs=f"{len(d['runs'])} test runs ({ran.get('train', 6)} training)",
               command=command)


def failing_modes(out: Outputs) -> Row:
    """The failing disks through a mount: where the mode machine took the model, and
    whether any switch to recommendation named a standing that does not beat the rule."""
    experiment = "the failing disk through a mount ([predictors.md](../predictors.md))"
    command = "`python -m tests.bench.failing_modes --runs 3` (as root)"
    measured = ("linux.health over the project's failing disks, `mlfs train`, the mode "
                "machine deciding")
    folders = sorted({Path(p).parent.name for p in out.glob("failing-modes*/run*.json")},
                     key=lambda name: int(name.rsplit("-", 1)[1]) if name[-1].isdigit() else 1)
    if not folders:
        return missing(experiment, measured, "", command)
    newest = folders[-1]  # failing-modes, then failing-modes-2, ...: each a run of --runs
    runs = [out.json(m) for m in out.glob(f"{newest}/run*.json")]
    ran = runs[0]["args"]
    reached = sum(1 for r in runs if any(s["to"] == "recommendation" for s in r["switches"]))
    unearned = sum(r["unearned_recommendations"] for r in runs)
    verdicts: dict[str, list[int]] = {}
    for n, r in enumerate(runs, 1):
        verdicts.setdefault(r["verdict"], []).append(n)
    said = "; ".join(f"run{'s' if len(ns) > 1 else ''} {', '.join(map(str, ns))}: {v}"
                     for v, ns in verdicts.items())
    efficiency = sorted(float(r["final"]["efficiency"]) for r in runs
                        if r["final"].get("efficiency") not in (None, "", "nan"))
    against_default = (f" (its efficiency against the default {efficiency[0]:.2f}–"
                       f"{efficiency[-1]:.2f} at the end)" if efficiency else "")
    result = (f"recommendation reached in {reached} of {len(runs)} runs, "
              f"{'never' if not unearned else f'**{unearned} time(s)**'} without the model "
              f"beating the rule{against_default}; {said}")
    return Row(experiment, measured, result,
               runs=f"{len(runs)} runs ({ran['train_disks']} training and "
                    f"{ran['test_disks']} test disks each; {newest})", command=command)


def kmsg_dedup(out: Outputs) -> Row:
    rel = "kmsg-dedup.json"
    command = "`python -m tests.bench.kmsg_dedup`"
    if not out.exists(rel):
        return missing("crash-report duplicates", "syzkaller's logs", "", command)
    d = out.json(rel)
    m = d["mlfs"]
    result = (f"F1 {m['f1']:.3f}, precision {m['precision']:.3f}, recall {m['recall']:.3f} "
              f"(signature or similarity ≥ {m['threshold']:g}) vs "
              f"{d['signature']['f1']:.3f} (signatures alone)")
    return Row(f"crash-report duplicates ({lab(rel)})",
               f"syzkaller's {d['logs']} titled logs, {d['pairs']:,} pairs", result,
               runs="**one run** (deterministic)", command=command)


def kmsg_titles(out: Outputs) -> Row:
    rel = "kmsg-titles.json"
    command = "`python -m tests.bench.kmsg_titles`"
    if not out.exists(rel):
        return missing("crash titles", "syzkaller's logs", "", command)
    d = out.json(rel)
    result = (f"titles equal syzkaller's on {d['titles_equal']:.1%} of {d['titled_logs']} "
              f"titled logs; `CORRUPTED` agrees on {d['corrupted_agrees']:.1%} of "
              f"{d['logs']}; the guilty file on {d['guilty_file_right']:.1%} of "
              f"{d['guilty_logs']}")
    return Row(f"crash titles ({lab(rel)})",
               f"syzkaller's pkg/report corpus, {d['logs']} logs and {d['guilty_logs']} "
               "guilty ones", result, runs="**one run** (deterministic)", command=command)


def bio_capture(out: Outputs) -> Row:
    rel = "bio-capture.json"
    command = "`python -m tests.bench.bio_capture` (as root)"
    if not out.exists(rel):
        return missing("per-request capture", "`linux.bio`", "", command)
    d = out.json(rel)
    on = [r for r in d["runs"] if r.get("capture")]
    lost = sum(r["lost"] for r in on)
    # the kernel's own count of the requests it completed (older runs: fio's I/Os)
    missed = [r.get("requests", r["total_ios"]) - r["records"] for r in on]
    cpu = [r["cpu_share_per_100k_per_s"] for r in on]
    recorded = (f"every request recorded, {lost} lost, in {sum(m == 0 for m in missed)} of "
                f"{len(on)}" if not any(missed) else
                f"requests not recorded and not counted lost: {', '.join(map(str, missed))} "
                f"of {on[0].get('requests', on[0]['total_ios']):,} (a defect, not found yet); "
                f"{lost} lost to the ring")
    near = d["iops_ratio"] >= 0.94  # bpftrace counting alone costs about 6 %
    result = (f"{recorded}; fio's IOPS ×{d['iops_ratio']:.2f} with the capture on (medians; "
              f"target: near bpftrace's ~6 % cost{'' if near else ', **not met**'}); "
              f"{min(cpu):.2f}–"
              f"{max(cpu):.2f} of a core per 100k requests/s")
    return Row(f"per-request capture ({lab(rel)})",
               f"`linux.bio` under fio randread 4k, iodepth 32, "
               f"{on[0]['total_ios'] // 1000}k requests, interleaved", result,
               runs=runs_cell(len(on)), command=command)


def kmsg_rates(out: Outputs) -> Row:
    rel = "kmsg-rates.json"
    command = "`python -m tests.bench.kmsg` (as root)"
    if not out.exists(rel):
        return missing("kernel log rates", "/dev/kmsg", "", command)
    d = out.json(rel)
    b, p = d["burst"], d["paced"]
    result = (f"{b['drained_per_s'] / 1000:.1f}k records/s drained (writer "
              f"{b['writer_per_s'] / 1000:.1f}k/s: {b['lost']:,} of {b['records']:,} lost to "
              f"ring overrun, as lost rows); {p['records_per_s']:,} records/s cost "
              f"{p['daemon_cpu_share_of_one_core']:.0%} of a core".replace("%", " %"))
    return Row(f"kernel log rates ({lab(rel)})",
               "/dev/kmsg into Parquet", result, runs="**one run**", command=command)


def records_ingest(out: Outputs) -> Row:
    rel = "records-ingest.json"
    command = "`python -m tests.bench.records_ingest`"
    if not out.exists(rel):
        return missing("record ingest", "sim.disks batches", "", command)
    d = out.json(rel)
    rate = d["ours_rows_per_s_median"] / 1e6
    ratios = [r["ratio"] for r in d["runs"]]
    result = (f"{rate:.2f} M rows/s (median; target ≥ 1 M {'met' if rate >= 1 else 'not met'}"
              f"); {spread(ratios)} pyarrow alone (target ≥ 0.5× "
              + ("met" if statistics.median(ratios) >= 0.5 else "**not met**: the "
                 "write-ahead file writes every batch once more") + ")")
    return Row("record ingest ([records-ingest.md](records-ingest.md))",
               "sim.disks batches through a record store (write-ahead IPC, seal) vs "
               "`pyarrow.parquet.write_table` alone", result, runs=runs_cell(len(ratios)),
               command=command)


def exchange(out: Outputs) -> Row:
    rel = "exchange-full.json"
    command = "`mlfs bench`"
    if not out.exists(rel):
        return missing("what the exchange costs", "`mlfs bench`", "", command)
    rows = {r["key"]: r for r in out.json(rel)["rows"]}
    ingest = rows["ingest"]["ratio"]["median"]
    first = rows["read_first"]["ratio"]["median"]
    p99 = rows["control_write"]["measured"]["p99 ms"]["median"]
    result = (f"ingest {ingest:.2f}× pyarrow; first read through the mount {first:.2f}×; "
              f"control round trip p99 {p99:.2f} ms")
    return Row("what the exchange costs ([exchange-full.md](exchange-full.md))",
               "`mlfs bench` against references in the same run", result,
               runs="**one run** (5 repetitions per figure)", command=command)


def writeback(out: Outputs) -> Row:
    return fio_row(out, "writeback ratios on fio workloads", "dirty-ratios.md",
                   "stream-write + db-commit + read-under-write, 5 s visits",
                   ["writeback-win-2"], "`python -m tests.bench.writeback_win --runs 3 "
                   "--train-seconds 240 --train-phase 15` (as root)")


def queue(out: Outputs) -> Row:
    """queue-win (the first run) and each queue-win-N folder since."""
    later = {int(Path(p).parent.name.rsplit("-", 1)[1])
             for p in out.glob("queue-win-*/run*.json")}
    return fio_row(out, "block queue on fio workloads", "history.md",
                   "scheduler, nr_requests; mixed-rw + seq-read + db-commit, 4 s visits",
                   ["queue-win", *(f"queue-win-{n}" for n in sorted(later))],
                   "`python -m tests.bench.queue_win --quick` (as root)")


#: issue 33's workload families mlfs was never tuned on: (folder, experiment, measured,
#: command); a row each once its folder is committed
FAMILIES = (
    ("readahead-fio-win", "read-ahead, files kept open",
     "read_ahead_kb; fio seq-scan + mmap-lookup, each visit's files open from its start, "
     "4 s visits", "`python -m tests.bench.readahead_fio_win --quick` (as root)"),
    ("readahead-fio-noadvice", "read-ahead, files kept open, no advice",
     "read_ahead_kb; fio seq-scan + mmap-index (no fadvise/madvise), each visit's files "
     "open from its start, 4 s visits",
     "`python -m tests.bench.readahead_fio_win --quick --phases seq-scan,mmap-index` "
     "(as root)"),
    ("dirty-bursts", "dirty ratio, phases shorter than its carry-over",
     "dirty_background_ratio; fio stream-burst + wal-commit, 6 s visits",
     "`python -m tests.bench.dirty_win --quick --phases stream-burst,wal-commit --seconds 6 "
     "--train-phase 6 --train-seconds 420 --judge-seconds 180` (as root)"),
    ("queue-oltp-backup", "block queue, fast-alternating phases",
     "scheduler, nr_requests; fio oltp + backup-read, 3 s visits",
     "`python -m tests.bench.queue_win --quick --phases oltp,backup-read --seconds 3 "
     "--train-phase 3` (as root)"),
)


def families(out: Outputs) -> list[Row]:
    """A row per family whose folder is committed."""
    return [fio_row(out, experiment, "families.md", measured, [folder], command)
            for folder, experiment, measured, command in FAMILIES
            if out.glob(f"{folder}/run*.json")]


def rows(out: Outputs) -> list[Row]:
    newest_readahead = [readahead(out, newest=True)] if newest_readahead_runs(out) else []
    return [learning(out), readahead(out), *newest_readahead, *dirty(out), writeback(out),
            queue(out), *families(out),
            fleet_coldstart(out), fleet_demo(out), predict(out), failing_predict(out),
            failing_modes(out), kmsg_titles(out), kmsg_dedup(out),
            bio_capture(out), kmsg_rates(out), records_ingest(out), exchange(out)]


# ---- the results page and README's headlines ----------------------------------------------
#: README's headlines: (the row's experiment as the table names it, the page that explains
#: it); at most eight, the rest is on the results page
HEADLINES = (
    ("learning loop", "learning-34.md"),
    ("fleet cold start", "fleet-coldstart.md"),
    ("drive failure prediction", "predict-sim-disks.md"),
    ("failure prediction on a real failing disk", "../predictors.md"),
    ("the failing disk through a mount", "../predictors.md"),
    ("crash titles", "../kernel-log.md"),
)


def table(out: Outputs | None = None) -> str:
    """The full table, for docs/results/README.md (links relative to docs/results/)."""
    out = out or Outputs()
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |"
              for r in rows(out)]
    return "\n".join([
        BEGIN,
        "<!-- generated by `python -m tests.bench.results` from the archives git tracks "
        "in bench-results/; do not edit by hand -->",
        "",
        "Ratios are median [min–max] over runs; \"× default\" and \"× best static\" score "
        "a job of equal work per phase (the harmonic mean of the per-phase ratios, "
        "`tests/bench/scoring.py`), whatever rule a run printed; \"of the oracle's gain\" "
        "is (mlfs − 1) / (oracle − 1) per run, the oracle being the sweep's best value per "
        "phase; \"worst phase\" is mlfs's phase with the lowest median ratio.",
        "",
        *lines,
        END])


def from_root(target: str) -> str:
    """A link written from docs/results/, as README (at the top) writes it."""
    if target.startswith("../../"):
        return target[6:]
    if target.startswith("../"):
        return "docs/" + target[3:]
    return f"{PAGES}/{target}"


def headline(row: Row, page: str) -> str:
    """One bullet: the row's figures (its ratios where it has them), its command, its page."""
    name = row.experiment.split(" (", 1)[0]
    if row.vs_default != NONE:
        said = (f"{row.vs_default} the default, {row.vs_best} the best static value "
                f"(equal work per phase; {row.runs.split(';')[0]})")
        if name == "learning loop":
            said = row.result.split(" (", 1)[0] + f" (median), {said}"
    else:
        said = re.sub(r" \(\[[^]]*\]\([^)]*\)\)", "", row.result)  # its raw file's link
    said = re.sub(r"\]\(([^)]+)\)", lambda m: f"]({from_root(m.group(1))})", said)
    item = f"- **{name}**: {said}. {row.command} ([details]({from_root(page)}))"
    return textwrap.fill(item, 100, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def headlines(out: Outputs | None = None) -> str:
    out = out or Outputs()
    by_name = {r.experiment.split(" (", 1)[0]: r for r in rows(out)}
    items = [headline(by_name[name], page) for name, page in HEADLINES if name in by_name]
    return "\n".join([
        HEAD_BEGIN,
        f"<!-- generated by `python -m tests.bench.results` (the rows of {INDEX}); do not "
        "edit by hand -->",
        *items,
        HEAD_END])


def fixed_table(out: Outputs | None = None) -> str:
    """README's table against the best fixed setting (`against_fixed`), from the runs
    archived in each of its experiments' folders."""
    out = out or Outputs()
    scored = {}
    for folder, _, stored, command in against_fixed.EXPERIMENTS:
        runs = sorted(out.glob(f"{folder}/run*.json"),
                      key=lambda p: int(Path(p).stem.removeprefix("run")))
        score = against_fixed.readahead_score if stored == "readahead" \
            else against_fixed.fio_score
        data = [out.json(r) for r in runs]
        for path, run in zip(runs, data, strict=True):
            differs = against_fixed.command_differs(command, run["args"]) \
                if "args" in run else {}
            if differs:
                raise ValueError(f"{path}: README's command for it differs from the options "
                                 f"the run stored (command, run): {differs}")
        scored[folder] = ([score(d) for d in data],
                          [d["commit"] for d in data if d.get("commit")])
    return "\n".join([
        FIXED_BEGIN,
        "<!-- generated by `python -m tests.bench.results` from the archives in "
        "bench-results/; do not edit by hand -->",
        *against_fixed.table(scored),
        FIXED_END])


def render(text: str, generated: str, begin: str = BEGIN, end: str = END) -> str:
    if begin not in text or end not in text:
        raise ValueError(f"the page lacks the markers {begin} / {end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + generated + tail


def regenerate(index: str, readme: str, out: Outputs) -> tuple[str, str]:
    """(the results page, README) with their generated parts as `out` gives them."""
    readme = render(readme, headlines(out), HEAD_BEGIN, HEAD_END)
    return (render(index, table(out)),
            render(readme, fixed_table(out), FIXED_BEGIN, FIXED_END))


def check_text(readme: str, root: Path = ROOT, index: str | None = None
               ) -> tuple[bool, str]:
    """(README and the results page hold what the committed outputs under `root` give,
    the unified diff from them to that if not)."""
    index = (root / INDEX).read_text() if index is None else index
    want_index, want_readme = regenerate(index, readme, Outputs(root))
    diff = "".join(
        [*difflib.unified_diff(index.splitlines(True), want_index.splitlines(True),
                               INDEX, f"{INDEX} (generated)"),
         *difflib.unified_diff(readme.splitlines(True), want_readme.splitlines(True),
                               "README.md", "README.md (generated)")])
    return index == want_index and readme == want_readme, diff


def check(root: Path = ROOT) -> tuple[bool, str]:
    """README.md and the results page against the committed outputs."""
    return check_text((root / "README.md").read_text(), root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 and print a diff if a generated part differs")
    parser.add_argument("--print", action="store_true", help="print the full table alone")
    parser.add_argument("--pack", nargs="+", type=Path, metavar="PATH",
                        help="add raw outputs (a run's folder or files) to bench-results/")
    args = parser.parse_args(argv)
    if args.pack:
        for archive in pack(args.pack):
            print(f"{archive}: {(ROOT / archive).stat().st_size:,} bytes")
        return 0
    if args.print:
        print(table())
        return 0
    if args.check:
        ok, diff = check()
        if not ok:
            sys.stdout.write(diff)
            print("the results differ from the committed outputs: run "
                  "python -m tests.bench.results", file=sys.stderr)
        return 0 if ok else 1
    index, readme = regenerate((ROOT / INDEX).read_text(), (ROOT / "README.md").read_text(),
                               Outputs())
    (ROOT / INDEX).write_text(index)
    (ROOT / "README.md").write_text(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
