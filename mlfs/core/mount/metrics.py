"""`metrics`: the exchange's counters and gauges in Prometheus text format.

The text exposition format wants every sample of a family together, after
that family's one `# HELP` and `# TYPE`: a scraper that meets a family's name
again later may take it for a second family (prometheus_client's parser read
a page with two subsystems as 87 families instead of 35).  So `_Writer`
collects samples per family in first-declared order and writes the page only
at the end: code adding a metric calls `metric()` wherever it has the value,
in any loop, and the grouping is never its concern.

Names follow the Prometheus conventions `promtool check metrics` enforces:
counters end in `_total`; a sum and a count of the same observations are one
`summary` family (`_sum`, `_count`), never a counter named `_sum`; the
process and build families carry the names every exporter uses
(`process_*`, `mlfs_build_info`), so stock dashboards and alerts find them.
"""

from __future__ import annotations

import math
import os
import resource

from mlfs import __version__
from mlfs.core.models.kinds import kind_of
from mlfs.core.models.model_files import MODES, STATES
from mlfs.core.models.modes import efficiency_interval

from .exchange import Exchange
from .histogram import Histogram
from .loading import Loader


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help_esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _num(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Family:
    __slots__ = ("kind", "help", "samples")

    def __init__(self, kind: str, help_text: str) -> None:
        self.kind = kind
        self.help = help_text
        self.samples: list[str] = []


class _Writer:
    """Samples grouped by family, rendered family by family by `text()`."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    def _family(self, name: str, kind: str, help_text: str) -> _Family:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _Family(kind, help_text)
        elif family.kind != kind:
            raise ValueError(f"metric {name}: declared as {family.kind}, then as {kind}")
        return family

    @staticmethod
    def _sample(name: str, value: float, labels: dict[str, object]) -> str:
        if not labels:
            return f"{name} {_num(value)}"
        label_text = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
        return f"{name}{{{label_text}}} {_num(value)}"

    def metric(self, name: str, kind: str, help_text: str, value: float,
               **labels: str) -> None:
        """One sample of the counter or gauge `name` (declared on first use)."""
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name}: counter names end in _total")
        self._family(name, kind, help_text).samples.append(self._sample(name, value, labels))

    def summary(self, name: str, help_text: str, total: float, count: int,
                **labels: str) -> None:
        """A summary without quantiles: the `_sum` and `_count` of some observations."""
        family = self._family(name, "summary", help_text)
        family.samples.append(self._sample(f"{name}_sum", total, labels))
        family.samples.append(self._sample(f"{name}_count", count, labels))

    def histogram(self, name: str, help_text: str, histogram: Histogram,
                  **labels: str) -> None:
        """A histogram: cumulative `_bucket{le}` samples, `_sum` and `_count`."""
        family = self._family(name, "histogram", help_text)
        for le, count in histogram.cumulative():
            family.samples.append(self._sample(f"{name}_bucket", count, {**labels, "le": le}))
        family.samples.append(self._sample(f"{name}_sum", round(histogram.total, 6), labels))
        family.samples.append(self._sample(f"{name}_count", histogram.count, labels))

    def text(self) -> str:
        lines: list[str] = []
        for name, family in self.families.items():
            lines.append(f"# HELP {name} {_help_esc(family.help)}")
            lines.append(f"# TYPE {name} {family.kind}")
            lines.extend(family.samples)
        return "\n".join(lines) + "\n"


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _process(w: _Writer) -> None:
    """The `process_*` families of the Prometheus client libraries, from /proc/self."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    w.metric("process_cpu_seconds_total", "counter",
             "Total user and system CPU time spent in seconds.",
             round(usage.ru_utime + usage.ru_stime, 3))
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(") ", 1)[1].split()
        # fields[0] is field 3 (state) of proc(5): starttime is 22, rss 24
        start_ticks, rss_pages = int(fields[19]), int(fields[21])
    except (OSError, IndexError, ValueError):
        start_ticks = rss_pages = None
    if rss_pages is not None:
        w.metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
                 rss_pages * os.sysconf("SC_PAGE_SIZE"))
    boot = _boot_time()
    if start_ticks is not None and boot is not None:
        w.metric("process_start_time_seconds", "gauge",
                 "Start time of the process since unix epoch in seconds.",
                 round(boot + start_ticks / os.sysconf("SC_CLK_TCK"), 2))
    try:
        w.metric("process_open_fds", "gauge", "Number of open file descriptors.",
                 len(os.listdir("/proc/self/fd")))
    except OSError:
        pass
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        w.metric("process_max_fds", "gauge", "Maximum number of open file descriptors.", soft)
    w.metric("mlfs_process_max_rss_bytes", "gauge", "Daemon peak resident set size.",
             usage.ru_maxrss * 1024)


def render(exchange: Exchange, loader: Loader | None = None,
           fuse_latency: dict[str, Histogram] | None = None) -> str:
    w = _Writer()
    w.metric("mlfs_build_info", "gauge", "Always 1; the version of mlfs serving the mount.", 1,
             version=__version__)
    _process(w)
    w.metric("mlfs_events_total", "counter", "Events published.", exchange.bus.published)
    w.metric("mlfs_event_readers", "gauge", "Open events files.",
             exchange.bus.subscriber_count)
    readers = exchange.readers.stats()
    w.metric("mlfs_event_reads_blocked", "gauge",
             "Reads of events files waiting for an event (each holds a FUSE worker task).",
             readers.blocked_reads)
    w.metric("mlfs_event_opens_refused_total", "counter",
             "Opens of events files refused by a per-uid or total limit (EMFILE/ENFILE).",
             readers.refused_opens)
    w.metric("mlfs_event_reads_refused_total", "counter",
             "Reads of events files that could not wait under the limits (EAGAIN).",
             readers.refused_reads)
    w.metric("mlfs_file_opens_refused_total", "counter",
             "Opens of other files of the mount refused by [mount] handles_per_uid or handles "
             "(EMFILE/ENFILE).", exchange.readers.refused_handles)
    w.metric("mlfs_loads_abandoned_total", "counter",
             "Run-time loads whose backend did not answer in time (ETIMEDOUT to the writer).",
             loader.builds_abandoned if loader else 0)
    w.metric("mlfs_loads_waiting", "gauge",
             "Run-time loads waiting for their backend now (each at most 2 s).",
             loader.loads_waiting if loader else 0)
    w.metric("mlfs_loads_stuck", "gauge",
             "Abandoned loads whose backend thread has not ended yet.",
             loader.builds_running if loader else 0)
    w.metric("mlfs_mount_emergency_pinned", "gauge",
             "1 while the operator's mount-wide emergency pin (MOUNT/control) holds.",
             1 if exchange.emergency_pinned else 0)
    for operation, histogram in sorted((fuse_latency or {}).items()):
        w.histogram("mlfs_fuse_operation_seconds", "How long the daemon took to answer each "
                    "FUSE request, by operation (an events read parked for an event included).",
                    histogram, operation=operation)
    for status, count in sorted(exchange.mount.actions.counts.items()):
        w.metric("mlfs_actions_total", "counter",
                 "Action commands of predictors' alerts, by how they ended.", count,
                 status=status)
    for status, count in sorted(exchange.recommendations.items()):
        w.metric("mlfs_recommendations_total", "counter",
                 "Recommendation journal entries by status.", count, status=status)
    for (subsystem, file), count in sorted(exchange.errors.items()):
        w.metric("mlfs_rejected_writes_total", "counter", "Refused writes by file.", count,
                 subsystem=subsystem, file=file)
    for runtime in exchange.runtimes.values():
        sub = runtime.name
        w.metric("mlfs_ticks_total", "counter", "Ticks this process ran (from 0 at each start; "
                 "the persistent tick number is mlfs_tick).", runtime.ticks, subsystem=sub)
        w.metric("mlfs_tick", "gauge", "The number the next tick gets: persistent across "
                 "restarts, never reused (this process's count is mlfs_ticks_total).",
                 runtime.next_tick,
                 subsystem=sub)
        w.histogram("mlfs_tick_duration_seconds", "How long each tick took (plan, the "
                    "backend's step, recording).", runtime.tick_durations, subsystem=sub)
        w.metric("mlfs_tick_seconds_total", "counter", "Wall time spent in ticks.",
                 round(runtime.tick_seconds_total, 6), subsystem=sub)
        w.metric("mlfs_tick_errors_total", "counter", "Ticks that failed.", runtime.errors,
                 subsystem=sub)
        w.metric("mlfs_dataset_rows_total", "counter", "Dataset rows appended.",
                 runtime.dataset.rows_total, subsystem=sub)
        w.metric("mlfs_dataset_rows_pending", "gauge", "Rows not yet sealed.",
                 runtime.dataset.pending, subsystem=sub)
        w.metric("mlfs_dataset_portions", "gauge", "Sealed portions visible.",
                 len(runtime.dataset.portions), subsystem=sub)
        w.metric("mlfs_dataset_bytes", "gauge", "Bytes of sealed portions.",
                 runtime.dataset.bytes(), subsystem=sub)
        w.metric("mlfs_portions_sealed_total", "counter", "Portions sealed.",
                 runtime.dataset.sealed_total, subsystem=sub)
        watch = runtime.watch
        w.metric("mlfs_store_failing", "gauge",
                 "Stores whose last write to the state dir failed (critical while > 0).",
                 len(watch.failing), subsystem=sub)
        w.metric("mlfs_store_failures_total", "counter",
                 "Failed WAL writes and seals (each retried until it works).",
                 watch.failures_total, subsystem=sub)
        w.metric("mlfs_store_rows_waiting", "gauge",
                 "Rows held in memory until a portion holds them (all stores).",
                 sum(store.waiting for store in watch.dirty), subsystem=sub)
        w.metric("mlfs_store_quarantined_rows_total", "counter",
                 "Rows or WAL lines that cannot be sealed, kept in quarantine/.",
                 watch.quarantined_rows_total, subsystem=sub)
        w.metric("mlfs_ticks_skipped_total", "counter",
                 "Ticks held because nothing could be recorded (store.max_waiting_rows).",
                 runtime.skipped_ticks, subsystem=sub)
        if runtime.application is not None:
            app = runtime.application
            w.metric("mlfs_objective_held_ticks", "gauge",
                     "Ticks whose row waits for the application's objective figure.",
                     len(app.held), subsystem=sub)
            w.metric("mlfs_objective_missing_total", "counter",
                     "Ticks recorded with no application figure (a missing objective).",
                     app.missing, subsystem=sub)
            w.metric("mlfs_objective_late_figures_total", "counter",
                     "Application figures whose window reached only ticks already recorded.",
                     app.late_figures, subsystem=sub)
        if runtime.records is not None:
            w.metric("mlfs_records_total", "counter", "Records appended to the record dataset.",
                     runtime.records.rows_total, subsystem=sub)
            w.metric("mlfs_records_lost_total", "counter",
                     "Records the source lost (ring overrun, drops) or the store could not take.",
                     runtime.records_lost, subsystem=sub)
            w.metric("mlfs_records_refused_total", "counter",
                     "Record batches refused whole (fields not as declared).",
                     runtime.records_refused, subsystem=sub)
        for kind, count in sorted(runtime.reports_by_kind.items()):
            w.metric("mlfs_reports_total", "counter",
                     "Report events (new signatures and rate-limited repeats) by kind.", count,
                     subsystem=sub, report_kind=kind)
        w.metric("mlfs_critical", "gauge",
                 "1 while the backend or the state dir reports a critical state.",
                 1 if runtime.critical else 0, subsystem=sub)
        objective = runtime.subsystem.objective
        w.metric("mlfs_objective", "gauge", "Last tick's objective, in the unit its `unit` "
                 "label names (the subsystem's own; `info` says the same).",
                 runtime.last_objective, subsystem=sub, objective=objective.name,
                 unit=objective.unit)
        knobs = runtime.subsystem.knobs
        for knob, value in runtime.knob_values.items():
            if isinstance(value, int):
                w.metric("mlfs_knob_value", "gauge", "Knob value in effect, in the unit its "
                         "`unit` label names.", value, subsystem=sub, knob=knob,
                         unit=knobs[knob].unit)
        for proxy in runtime.models.values():
            labels = {"subsystem": sub, "model": proxy.name}
            stats = proxy.evidence()
            w.metric("mlfs_model_efficiency", "gauge",
                     "Rolling efficiency: each ML tick against the default ticks around it "
                     "(efficiency.py; 1 = as good as the default).",
                     stats.efficiency, **labels)
            w.metric("mlfs_model_efficiency_confidence", "gauge",
                     "z of the window's paired efficiency away from 1 (delta method, "
                     "efficiency.py; positive = ML better).",
                     stats.confidence, **labels)
            interval = efficiency_interval(stats)
            w.metric("mlfs_model_efficiency_known", "gauge",
                     "1 when the mode machine may act on the efficiency, 0 while it is "
                     "unknown (too few episodes, no measured spread, or episodes that "
                     "straddle phases; modes.py).", int(interval.known), **labels)
            w.metric("mlfs_model_efficiency_lower", "gauge",
                     "Lower end of the efficiency's anytime-valid interval (sequential.py; "
                     "-Inf while unknown).", interval.lower, **labels)
            w.metric("mlfs_model_efficiency_upper", "gauge",
                     "Upper end of the efficiency's anytime-valid interval (sequential.py; "
                     "+Inf while unknown).", interval.upper, **labels)
            w.metric("mlfs_model_efficiency_pairs", "gauge",
                     "ML ticks counted in the window's efficiency (stable pairs; settling "
                     "ticks and pairs straddling a workload change are left out).",
                     stats.ml_ticks, **labels)
            w.metric("mlfs_model_efficiency_reverse_pairs", "gauge",
                     "Default ticks counted against the ML ticks around them (carry-over "
                     "knobs: they balance a workload phase's own profile out, efficiency.py).",
                     stats.reverse_ticks, **labels)
            standing = proxy.incumbent.standing()
            w.metric("mlfs_model_incumbent_efficiency", "gauge",
                     "The incumbent's efficiency at the current level: the best fixed setting "
                     "measured there against the default (incumbent.py; 1 = the default).",
                     standing.estimate, **labels)
            w.metric("mlfs_model_efficiency_vs_incumbent", "gauge",
                     "The policy's efficiency at the current level over the incumbent's "
                     "(incumbent.py; NaN until the policy has enough episodes there).",
                     standing.vs_incumbent, **labels)
            for mode in MODES:
                w.metric("mlfs_model_mode", "gauge", "1 for the model's current mode.",
                         1 if proxy.mode == mode else 0, mode=mode, **labels)
            for state in STATES:
                w.metric("mlfs_model_state", "gauge", "1 for the model's current state.",
                         1 if proxy.state == state else 0, state=state, **labels)
            w.metric("mlfs_model_ml_ticks_total", "counter", "Ticks controlled by ML.",
                     proxy.ml_ticks, **labels)
            w.metric("mlfs_model_default_ticks_total", "counter",
                     "Ticks the default ran while the model was started.",
                     proxy.default_ticks, **labels)
            w.metric("mlfs_model_feedback_rows_total", "counter", "Feedback rows written.",
                     proxy.feedback.rows_total, **labels)
            w.summary("mlfs_model_feedback_abs_error",
                      "|observed - expected| over feedback rows with an expectation "
                      "(rate of _sum / rate of _count = the mean absolute error).",
                      round(proxy.errors_abs_sum, 6), proxy.errors_count, **labels)
            w.metric("mlfs_model_policy_loaded", "gauge", "1 when a policy is loaded.",
                     1 if proxy.policy else 0, **labels)
            kind_metrics = kind_of(proxy).metrics  # the kind's own (kinds.ModelKind.metrics)
            if kind_metrics is not None:
                kind_metrics(proxy, w, labels)
    return w.text()
