"""`metrics`: the exchange's counters and gauges in Prometheus text format."""

from __future__ import annotations

import math
import resource
import time

from .exchange import Exchange
from .proxy import MODES, STATES


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._declared: set[str] = set()

    def metric(self, name: str, kind: str, help_text: str, value: float,
               **labels: str) -> None:
        if name not in self._declared:
            self._declared.add(name)
            self.lines.append(f"# HELP {name} {help_text}")
            self.lines.append(f"# TYPE {name} {kind}")
        label_text = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{label_text}}} {_num(value)}" if labels
                          else f"{name} {_num(value)}")


def render(exchange: Exchange) -> str:
    w = _Writer()
    w.metric("mlfs_uptime_seconds", "gauge", "Seconds since the mount started.",
             round(time.time() - exchange.started, 3))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    w.metric("mlfs_process_cpu_seconds_total", "counter", "Daemon CPU time.",
             round(usage.ru_utime + usage.ru_stime, 3))
    w.metric("mlfs_process_max_rss_bytes", "gauge", "Daemon peak resident set size.",
             usage.ru_maxrss * 1024)
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
    w.metric("mlfs_mount_emergency_pinned", "gauge",
             "1 while the operator's mount-wide emergency pin (MOUNT/control) holds.",
             1 if exchange.emergency_pinned else 0)
    for status, count in sorted(exchange.recommendations.items()):
        w.metric("mlfs_recommendations_total", "counter",
                 "Recommendation journal entries by status.", count, status=status)
    for (subsystem, file), count in sorted(exchange.errors.items()):
        w.metric("mlfs_rejected_writes_total", "counter", "Refused writes by file.", count,
                 subsystem=subsystem, file=file)
    for runtime in exchange.runtimes.values():
        sub = runtime.name
        w.metric("mlfs_ticks_total", "counter", "Ticks run.", runtime.ticks, subsystem=sub)
        w.metric("mlfs_tick", "gauge", "Number of the next tick.", runtime.next_tick,
                 subsystem=sub)
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
        w.metric("mlfs_critical", "gauge", "1 while the backend reports a critical state.",
                 1 if runtime.critical else 0, subsystem=sub)
        w.metric("mlfs_objective", "gauge", "Last tick's objective.", runtime.last_objective,
                 subsystem=sub)
        for knob, value in runtime.knob_values.items():
            if isinstance(value, int):
                w.metric("mlfs_knob_value", "gauge", "Knob value in effect.", value,
                         subsystem=sub, knob=knob)
        for proxy in runtime.models.values():
            labels = {"subsystem": sub, "model": proxy.name}
            stats = proxy.window.stats()
            w.metric("mlfs_model_efficiency", "gauge",
                     "Rolling efficiency vs the default algorithm (1 = as good).",
                     stats.efficiency, **labels)
            w.metric("mlfs_model_efficiency_confidence", "gauge",
                     "Welch z of ML vs default in the window (positive = ML better).",
                     stats.confidence, **labels)
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
            w.metric("mlfs_model_feedback_abs_error_sum", "counter",
                     "Sum of |observed - expected| over feedback rows with an expectation.",
                     round(proxy.errors_abs_sum, 6), **labels)
            w.metric("mlfs_model_feedback_expected_total", "counter",
                     "Feedback rows with an expectation (divide the sum by it for the MAE).",
                     proxy.errors_count, **labels)
            policy = proxy.policy
            w.metric("mlfs_model_policy_loaded", "gauge", "1 when a policy is loaded.",
                     1 if policy else 0, **labels)
            if policy and policy.decisions:
                w.metric("mlfs_model_policy_inference_seconds", "gauge",
                         "Mean in-process policy inference time per ML tick.",
                         policy.seconds / policy.decisions, **labels)
    return "\n".join(w.lines) + "\n"
