"""`mlfs demo`: one end-to-end run per kind of model on the embedded default.

`DEMOS` is keyed as `mlfs.core.models.kinds.KINDS`: a kind's demo is one entry here
and one module beside this one.  Each runs as `function(seconds=, seed=, keep=)`
and returns the command's exit status."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlfs.base.tables import add_entry, load_target


@dataclass(frozen=True)
class Demo:
    """One kind's demo: "module:function", imported when it runs, and a line of help."""

    name: str
    runner: str
    help: str

    def load(self) -> Callable[..., int]:
        return load_target(self.runner)


DEMOS: dict[str, Demo] = {}


def register(demo: Demo) -> Demo:
    return add_entry(DEMOS, demo, "demo")


register(Demo("knob", "mlfs.demos.knob:run_demo",
              "a read-ahead model on sim.readahead learns and climbs the modes"))
register(Demo("predictor", "mlfs.demos.predictor:run_predict_demo",
              "a drive-failure model on sim.disks is scored beside SMART's threshold trip"))

__all__ = ["DEMOS", "Demo", "register"]
