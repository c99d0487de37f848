"""Deprecated: the facade of the real-knob toolkit; import from `mlfs.backends.linux.*`.

Each name comes from its own module of the package `mlfs.backends.linux`
(docs/writing-a-backend.md).
"""

# ruff: noqa: E402  (the warning comes before the re-exports, on purpose)

import warnings

warnings.warn("mlfs.backends.linux_common is deprecated and goes in mlfs 0.2: import from "
              "mlfs.backends.linux.files, .knobs, .ledger, .controller or .subsystem",
              DeprecationWarning, stacklevel=2)

from .linux.controller import RETRY_SECONDS, KnobController
from .linux.files import (
    DEVICE_NAME,
    UnavailableError,
    boot_id,
    bulk_write_kb_per_call,
    parse_bracketed,
    process_start,
    read_key_values,
    read_psi,
    read_psi_file,
    read_text,
    read_write_calls,
    write_calls_by_process,
    write_text,
)
from .linux.knobs import KnobSpec, Rule, check_measure, describe_rules, parse_apply, read_value
from .linux.ledger import (
    KERNEL_ROOTS,
    LEDGER_DIR,
    Ledger,
    describe_salvage,
    entry_problem,
    recover,
    restore_entry,
    restore_state_dir,
    salvage,
)
from .linux.subsystem import LinuxSubsystem, rate

__all__ = [
    "DEVICE_NAME", "KERNEL_ROOTS", "LEDGER_DIR", "RETRY_SECONDS", "KnobController", "KnobSpec",
    "Ledger", "LinuxSubsystem", "Rule", "UnavailableError", "boot_id", "bulk_write_kb_per_call",
    "check_measure",
    "describe_rules", "describe_salvage", "entry_problem", "parse_apply", "parse_bracketed",
    "process_start", "rate", "read_key_values", "read_psi", "read_psi_file", "read_text",
    "read_value", "read_write_calls", "recover", "restore_entry", "restore_state_dir", "salvage",
    "write_calls_by_process", "write_text",
]
