"""The fleet store's layout: where each shipped portion and each policy lives.

A fleet store is an fsspec URL (a directory by default: a shared file system
in production, a local directory when embedded; `s3://...` where s3fs is
installed).  Shipped portions are hive-partitioned Parquet, so DuckDB,
Polars, pyarrow, Spark and Dask read a kind of rows as one table:

    subsystem=<S>/host=<H>/kind=dataset/<NNNNNNNNNN>.parquet
    subsystem=<S>/host=<H>/kind=records/<NNNNNNNNNN>.parquet      a record dataset
    subsystem=<S>/host=<H>/kind=feedback/model=<M>/<NNNNNNNNNN>.parquet
    subsystem=<S>/host=<H>/kind=recommendations/model=<M>/<NNNNNNNNNN>.parquet
    policies/<S>/<NNNNNNNNNN>.txt     a fleet policy (LightGBM text)
    policies/<S>/<NNNNNNNNNN>.sig     the card's Ed25519 signature (mlfs/fleet/signing.py)
    policies/<S>/<NNNNNNNNNN>.json    its model card, written last
    claims/<H>.json                   which state directory pushes as host H (host.py)
    manifests/<H>.json                host H's shipped portion numbers per source,
                                      written after the objects (manifest.py)
    status/<H>.json                   host H's pusher after its last pass: backlog,
                                      losses, cursor, each model's mode and efficiency
    info/<S>/<H>.json                 the subsystem's `info` as host H serves it
                                      (knobs, features, objective: what a trainer
                                      builds its columns from)

An object's name is derived from (subsystem, host, kind, model, portion
number) and nothing else, so shipping a portion again (a pusher killed after
the upload, before its cursor moved) replaces the object with the same rows:
never a duplicate.  Each row carries the host columns `HOST_COLUMNS`; the
partition key is `host`, so no row column may be called that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlfs.base.portion import PORTION_SUFFIX, portion_name
from mlfs.base.shipped import source_key

KINDS = ("dataset", "records", "feedback", "recommendations")
#: kinds kept per subsystem (their portions live under <subsystem>/<kind>/ in the mount)
SUBSYSTEM_KINDS = ("dataset", "records")
#: kinds kept per model (their portions live under models/<m>/<kind>/ in the mount)
MODEL_KINDS = ("feedback", "recommendations")
#: constant columns appended to every shipped row
HOST_COLUMNS = ("host_id", "host_name", "kernel_release", "machine", "mlfs_version")
POLICIES = "policies"
INFO = "info"
STATUS = "status"
_VERSION = re.compile(r"^(\d{10})\.(txt|json|sig)$")
#: versions have 10 digits: the largest one
MAX_VERSION = 9_999_999_999
#: the largest small document a reader takes from the store (a card, a status record,
#: an info, a claim), checked before reading (red-team F10: a 1.5 GB card read whole)
MAX_DOCUMENT_BYTES = 1 << 20
#: an Ed25519 signature is 64 bytes; anything much larger is not one
MAX_SIGNATURE_BYTES = 1024


@dataclass(frozen=True, order=True)
class Source:
    """One sequence of sealed portions in a mount: a dataset or a model's journal."""

    subsystem: str
    kind: str
    model: str = ""

    def mount_dir(self) -> str:
        """Relative to the mountpoint."""
        if self.kind in SUBSYSTEM_KINDS:
            return f"{self.subsystem}/{self.kind}"
        return f"{self.subsystem}/models/{self.model}/{self.kind}"

    def key(self) -> str:
        """The cursor's key: `S/kind` or `S/kind/model` (the daemon reads it too)."""
        return source_key(self.mount_dir())

    def object_dir(self, host: str) -> str:
        parts = [f"subsystem={self.subsystem}", f"host={host}", f"kind={self.kind}"]
        if self.model:
            parts.append(f"model={self.model}")
        return "/".join(parts)

    def object_path(self, host: str, number: int) -> str:
        return f"{self.object_dir(host)}/{portion_name(number)}"


def portion_number(name: str) -> int | None:
    """7 for `0000000007.parquet`; None for anything else (temporary names too)."""
    stem = name[: -len(PORTION_SUFFIX)] if name.endswith(PORTION_SUFFIX) else ""
    return int(stem) if stem.isdigit() and len(stem) == 10 else None


def policy_path(subsystem: str, version: int, suffix: str) -> str:
    return f"{POLICIES}/{subsystem}/{version:010d}.{suffix}"


def policy_version(name: str) -> tuple[int, str] | None:
    """(7, "json") for `0000000007.json`; None for anything else."""
    match = _VERSION.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def info_path(subsystem: str, host: str) -> str:
    return f"{INFO}/{subsystem}/{host}.json"


def status_path(host: str) -> str:
    return f"{STATUS}/{host}.json"
