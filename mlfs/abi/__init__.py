"""The backend ABI: what a subsystem implements and the rules everyone shares.

A backend is a Python package that provides subsystems (docs/writing-a-backend.md): the
proposal's kernel subsystem, a state that can be sampled (features), knobs that
can be set, a default algorithm (the human-made policy) and an objective
measured per tick.  The exchange (mlfs.core) drives each subsystem one tick at
a time and learns nothing about its internals; the trainers (mlfs.trainers)
read what it publishes.  Three parties therefore have to agree on a few rules,
and this package is the only place they are defined, one module per concept:

* `knobs`: `Knob`, its values, the candidate grid and the tie-break
  (`candidate_values`, `distance_from_default`) that the proxy running a policy
  and the trainer recommending must share;
* `subsystem`: the interface (`Subsystem`, `Objective`, `Target`, `Sample`, the
  `Sample.extra` keys), the dataset's column names and the name pattern `NAME`;
* `settings`: how a backend checks its `[[subsystem]]` table before anything is
  built (`Schema`, `check_settings`, `SettingError`, the checks `number`, `word`,
  `text`, ...), and the settings the core reads itself from the same table;
* `windows`: window features over an entity's recent rows (predictors);
* `backend`: `Backend`, the one object a backend module exports as `BACKEND`,
  and the entry-point group `ENTRY_POINT_GROUP` it registers in;
* `durable`: the toolkit a backend needs for files of its own (the real-knob
  ledger, a BPF loader cache): durable writes and bounded reads, by the same
  rules as the daemon's.

A backend imports only from here (and, for real knobs, the toolkit package
`mlfs.backends.linux`, itself built on this package).  This face re-exports
every public name; import from it, not from the modules.

`ABI_VERSION` is shown in each subsystem's `info` as `abi`.  It changes only
when something here changes incompatibly (a member removed or its meaning
changed); members added with a default keep the version.

Everything here is synchronous, FUSE-free and cheap to import (no pyarrow, no
numpy at import, no LightGBM): a third-party backend and the trainer both import it.
"""

from __future__ import annotations

from . import durable
from .backend import ENTRY_POINT_GROUP, Backend, ConformanceEnv, ExampleUnavailable, backend_problem
from .durable import (
    DAMAGED_SUFFIX,
    NotRegular,
    TooLarge,
    UnsafePath,
    fsync_dir,
    open_dir,
    open_regular,
    read_bounded,
    set_aside,
    write_durably,
)
from .knobs import (
    MAX_SETTLE,
    MAX_VALUES_PER_KNOB,
    Knob,
    KnobValue,
    KnobValueError,
    Settling,
    candidate_values,
    distance_from_default,
    episode_ticks,
)
from .settings import (
    ACTION_SETTINGS,
    CORE_SETTINGS,
    MAX_TICK_SECONDS,
    MIN_TICK_SECONDS,
    NO_DEFAULT,
    OBJECTIVE_SETTINGS,
    Check,
    Schema,
    SettingError,
    application_objective,
    boolean_or,
    check_settings,
    defaults_from,
    describe_schema,
    described,
    list_of,
    number,
    split_core_settings,
    table,
    text,
    tick_seconds,
    word,
)
from .subsystem import (
    ABI_VERSION,
    APPLICATION,
    CORE_COLUMNS,
    EXTRA_APPLIED,
    EXTRA_FOREIGN,
    EXTRA_RECORDS_LOST,
    EXTRA_REFUSED,
    EXTRA_REPORTS,
    FEATURE_TYPES,
    NAME,
    NAME_RULE,
    RECORD_CORE_COLUMNS,
    RECORD_TYPES,
    Objective,
    Sample,
    Subsystem,
    Target,
    column_name,
    knob_column,
    subsystem_problems,
)
from .windows import (
    MAX_WINDOW,
    WINDOW_AGGREGATES,
    WindowFeature,
    WindowState,
    window_feature,
    window_features,
)

__all__ = [
    # backend
    "ENTRY_POINT_GROUP", "Backend", "ConformanceEnv", "ExampleUnavailable", "backend_problem",
    # durable files (the toolkit)
    "durable", "DAMAGED_SUFFIX", "NotRegular", "TooLarge", "UnsafePath", "fsync_dir",
    "open_dir", "open_regular", "read_bounded", "set_aside", "write_durably",
    # knobs
    "MAX_SETTLE", "MAX_VALUES_PER_KNOB", "Knob", "KnobValue", "KnobValueError", "Settling",
    "candidate_values", "distance_from_default", "episode_ticks",
    # settings
    "ACTION_SETTINGS", "CORE_SETTINGS", "MAX_TICK_SECONDS", "MIN_TICK_SECONDS", "NO_DEFAULT",
    "OBJECTIVE_SETTINGS", "Check", "Schema", "SettingError", "application_objective",
    "boolean_or", "check_settings", "defaults_from", "describe_schema", "described",
    "list_of", "number", "split_core_settings", "table", "text", "tick_seconds", "word",
    # subsystem
    "ABI_VERSION", "APPLICATION", "CORE_COLUMNS", "EXTRA_APPLIED", "EXTRA_FOREIGN",
    "EXTRA_RECORDS_LOST", "EXTRA_REFUSED", "EXTRA_REPORTS", "FEATURE_TYPES", "NAME",
    "NAME_RULE", "RECORD_CORE_COLUMNS", "RECORD_TYPES", "Objective", "Sample", "Subsystem",
    "Target", "column_name", "knob_column", "subsystem_problems",
    # windows
    "MAX_WINDOW", "WINDOW_AGGREGATES", "WindowFeature", "WindowState", "window_feature",
    "window_features",
]
