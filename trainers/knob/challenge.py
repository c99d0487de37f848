"""The fleet challenge: when a host drops an adopted fleet policy for learning alone.

A newcomer adopts a policy fitted on what other hosts measured (mlfs/fleet/pull.py);
that prior is worth what it predicts here.  Kept apart from the fit because it is a
decision, not a fit: which of four boosters -- the prior as it came, the prior tuned
in level, the prior tuned freely, learning alone -- predicts this host's newest rows
best, and whether learning alone wins by a margin that stays valid however often the
host asks (`drop_verdict`, the sequential test of mlfs/base/sequential.py).
`KnobLearner.challenge` installs what `judge` chooses.
"""

from __future__ import annotations

import math
from typing import Any

import lightgbm as lgb
import numpy as np

from mlfs.base.sequential import MIN_EPISODES, boundary

from .fit import BoosterFitting

#: consecutive holdout rows that make one sample of `challenge`'s test: a row's error
#: is not independent of its neighbours' (one workload phase runs for many ticks), a
#: block of them is nearer to it; 20 rows are one second of the demo's ticks
CHALLENGE_BLOCK = 20
#: the modes a policy reaches only on the mode machine's anytime-valid evidence that it
#: beats the default (docs/ABI.md, "Mode switching"): there an adopted prior is winning
ROLLED_OUT_MODES = frozenset({"collaboration", "recommendation"})


def judge(fitting: BoosterFitting, prior: lgb.Booster, X: np.ndarray, y: np.ndarray,
          w: np.ndarray, rolled_out: bool) -> dict[str, Any]:
    """The challenge's verdict on rows `X`, `y` (by tick) weighted `w`: `chosen` is
    "prior", "tuned" or "local" (`KnobLearner.challenge` says what each means), with
    each candidate's holdout RMSE and, unless `rolled_out`, the test's figures."""
    n = len(y)
    cut = n - n // 5
    candidates = {"prior": prior, "tuned": fitting.tune(prior, X[:cut], y[:cut], w[:cut])}
    if not rolled_out:  # the judges: only a prior that is not winning can be dropped
        candidates["free"] = fitting.tune(prior, X[:cut], y[:cut], w[:cut], level_only=False)
        candidates["local"] = fitting.train(X[:cut], y[:cut], w[:cut],
                                            fitting.num_boost_round)
    errors = {name: np.abs(y[cut:] - booster.predict(X[cut:], num_threads=fitting.threads))
              for name, booster in candidates.items()}
    rmse = {name: float(np.sqrt(np.mean(value ** 2))) for name, value in errors.items()}
    kept = min(("prior", "tuned"), key=lambda name: (rmse[name], name != "prior"))
    out: dict[str, Any] = {"rows": n, "chosen": kept, "dropped": False,
                           **{f"{name}_rmse": value for name, value in rmse.items()},
                           "defended_by": "rollout"}
    if not rolled_out:
        verdicts = {name: drop_verdict(errors["local"], errors[name])
                    for name in ("prior", "tuned", "free")}
        # the prior stands while any way of keeping it holds against learning alone
        defended = max(verdicts, key=lambda name: (not verdicts[name]["drop"],
                                                   verdicts[name]["z"] or math.inf))
        verdict = verdicts[defended]
        out.update(defended_by=defended, z=verdict["z"], boundary=verdict["boundary"],
                   blocks=verdict["blocks"])
        if verdict["drop"]:
            out.update(chosen="local", dropped=True)
    return out


def drop_verdict(local_loss: np.ndarray, kept_loss: np.ndarray,
                 block: int = CHALLENGE_BLOCK) -> dict[str, Any]:
    """Whether learning alone predicts better than the kept prior by a margin that stays
    valid however often it is asked (`KnobLearner.challenge`, every refit).

    The samples are the per-row differences of loss (local - kept; `challenge` passes
    absolute errors: squared error is carried by a few rows) on the same holdout rows,
    averaged over blocks of `block` consecutive rows; their z (mean over its standard
    error) must fall below minus the normal-mixture boundary of mlfs/base/sequential.py --
    the test the proxy's mode machine decides with -- at `MIN_EPISODES` blocks or more.
    A lower RMSE alone is not enough: on a few hundred rows it swings either way with
    the phase the holdout happened to catch, and a drop cannot be taken back."""
    differences = np.asarray(local_loss, dtype=np.float64) - np.asarray(kept_loss,
                                                                        dtype=np.float64)
    usable = len(differences) // block * block
    means = differences[:usable].reshape(-1, block).mean(axis=1)
    needed = boundary(len(means))
    out: dict[str, Any] = {"drop": False, "blocks": len(means), "z": None,
                           "boundary": round(needed, 3)}
    if len(means) < MIN_EPISODES:
        return out
    spread = float(means.std(ddof=1)) / np.sqrt(len(means))
    if not spread > 0:
        return out
    z = float(means.mean()) / spread
    out["z"] = round(z, 3)
    out["drop"] = z <= -needed
    return out
