"""A predictor's inputs: the prediction lines written into `recommend`, and the
uploaded policy (a verified binary LightGBM model over record columns) that makes one
probability per record row."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mlfs.abi import Target, window_feature
from mlfs.base.errors import invalid
from mlfs.base.verifier import MAX_POLICY_BYTES, gives_probability, verify

#: nodes a policy may visit per tick over all rows (LightGBM: ~3.5 ns each, so ~0.1 s)
MAX_PREDICT_NODES = 32_000_000
#: the longest a written prediction may last, in ticks
MAX_TTL = 1_000_000


@dataclass(frozen=True)
class Prediction:
    """One checked line of `recommend`: `<key>=<value> target=<name> p=<prob> [ttl=N]`."""

    line: str
    target: str
    key: object
    p: float
    ttl: int | None
    expect: None = None


def parse_predictions(data: bytes, targets: dict[str, Target],
                      records: dict[str, str]) -> list[Prediction]:
    """Every line of a write, checked whole: Refused (EINVAL) on the first bad one."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise invalid("predictions are ASCII lines") from None
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for word in line.split():
            name, sep, value = word.partition("=")
            if not sep or not value or name in fields:
                raise invalid(f"{word[:40]!r} is not key=value (each key once)")
            fields[name] = value
        target = targets.get(fields.pop("target", ""))
        if target is None:
            raise invalid(f"target must be one of {', '.join(sorted(targets))}")
        if target.key not in fields:
            raise invalid(f"a {target.name} prediction names its {target.key}=")
        key = _key_value(fields.pop(target.key), records[target.key], target.key)
        try:
            p = float(fields.pop("p"))
        except KeyError:
            raise invalid("p= (the probability) is missing") from None
        except ValueError:
            raise invalid("p= is not a number") from None
        if not 0.0 <= p <= 1.0:
            raise invalid(f"p={p:g} is not a probability in [0, 1]")
        ttl = None
        if "ttl" in fields:
            raw = fields.pop("ttl")
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_TTL:
                raise invalid(f"ttl={raw[:20]} is not a tick count in 1..{MAX_TTL}")
            ttl = int(raw)
        if fields:
            raise invalid(f"unknown field {sorted(fields)[0]!r}")
        out.append(Prediction(line, target.name, key, p, ttl))
    if not out:
        raise invalid("no prediction in the write")
    return out


def _key_value(raw: str, kind: str, name: str) -> object:
    if kind == "string":
        if len(raw) > 256:
            raise invalid(f"{name}= is longer than 256 characters")
        return raw
    if kind in ("int64", "uint64", "int32", "uint32", "uint16", "uint8"):
        if not raw.lstrip("-").isdigit() or len(raw) > 20:
            raise invalid(f"{name}={raw[:20]} is not an integer")
        return int(raw)
    raise invalid(f"{name} ({kind}) cannot key predictions")


class PredictionPolicy:
    """A verified binary LightGBM model over record columns: one probability per row."""

    def __init__(self, text: bytes, records: dict[str, str]) -> None:
        import lightgbm

        if len(text) > MAX_POLICY_BYTES:
            raise invalid(f"policy over {MAX_POLICY_BYTES} bytes")
        self.verified = verify(text)
        if not gives_probability(self.verified):
            raise invalid(f"policy objective {self.verified.objective!r} is a regression; a "
                          "predictor needs LightGBM's binary objective (a probability)")
        self.text = text
        self.feature_names = list(self.verified.feature_names)
        numeric = {n for n, kind in records.items() if kind not in ("string",)}
        #: the window features the policy names (mlfs.abi): computed by the proxy from
        #: each entity's last rows, as the trainer computed them from the dataset
        self.windows: list[str] = []
        for name in self.feature_names:
            if name in numeric:
                continue
            window = window_feature(name)
            if window is None or window.field not in numeric:
                raise invalid(f"policy uses column {name!r}, not a numeric record field "
                              "or a window feature of one (<field>__mean|pos|first<W>)")
            self.windows.append(name)
        self.booster = lightgbm.Booster(model_str=text.decode("ascii"))
        if (list(self.booster.feature_name()) != self.feature_names
                or self.booster.num_trees() != self.verified.trees):
            raise invalid("LightGBM read another model than the verifier did")
        self.max_rows = max(1, MAX_PREDICT_NODES // max(1, self.verified.path_sum))
        self.rows_cut = 0

    def predict(self, table: pa.Table, windows: dict[str, np.ndarray] | None = None,
                ) -> np.ndarray:
        """Probabilities for the rows (NaN beyond the node bound: no alert, counted);
        `windows` holds the window features' values for the same rows."""
        n = table.num_rows
        rows = min(n, self.max_rows)
        self.rows_cut += n - rows
        matrix = np.empty((rows, len(self.feature_names)))
        for j, name in enumerate(self.feature_names):
            if name in self.windows:
                matrix[:, j] = (windows or {})[name][:rows]
                continue
            column = table.column(name).slice(0, rows)
            if pa.types.is_timestamp(column.type):
                column = column.cast(pa.int64())
            matrix[:, j] = column.to_numpy(zero_copy_only=False).astype(np.float64)
        out = np.full(n, math.nan)
        if rows:
            out[:rows] = self.booster.predict(matrix, num_threads=1)
        return out


__all__ = ["Prediction", "PredictionPolicy", "parse_predictions"]
