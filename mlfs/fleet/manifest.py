"""Manifests: which shipped objects are complete, for stores without atomic rename.

On a directory store an object appears by rename, whole or not at all, so a
listing is the truth.  On an object store (S3) or any fsspec file system
without atomic rename, an object can be listed while a killed pusher left it
half written.  So every pusher keeps, per source, the ranges of portion
numbers it has shipped (in its durable cursor) and writes them as
`manifests/<host>.json` after the objects they name: a reader that takes the
objects from the manifests never sees a torn one.  A pusher killed after an
object and before the manifest ships that object again under the same name on
restart (names depend only on the portion), then the manifest: exactly once.

Readers (`objects`) use the manifests on every store except a directory,
where they fall back to listing when no manifest exists (stores filled before
manifests, or by hand).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .layout import SUBSYSTEM_KINDS, Source

if TYPE_CHECKING:
    from .push import Store

MANIFESTS = "manifests"


def manifest_path(host: str) -> str:
    return f"{MANIFESTS}/{host}.json"


def add(ranges: list[list[int]], number: int) -> None:
    """Record `number` (shipped in increasing order per source) in sorted ranges."""
    if ranges and ranges[-1][1] + 1 == number:
        ranges[-1][1] = number
    elif not ranges or ranges[-1][1] < number:
        ranges.append([number, number])


def numbers(ranges: list[list[int]]) -> Iterator[int]:
    for lo, hi in ranges:
        yield from range(int(lo), int(hi) + 1)


def document(host: str, ranges: dict[str, list[list[int]]], sources: dict[str, Source]) -> bytes:
    body = {"host_id": host, "sources": {
        key: {"subsystem": s.subsystem, "kind": s.kind, "model": s.model, "ranges": ranges[key]}
        for key, s in sorted(sources.items()) if ranges.get(key)}}
    return json.dumps(body, sort_keys=True).encode() + b"\n"


def objects(store: Store, subsystem: str, kind: str) -> list[str]:
    """Store paths of the complete shipped objects of `kind` whose subsystem matches
    `subsystem` (a name or glob), oldest first per host."""
    found = store.fs.glob(store.path(f"{MANIFESTS}/*.json"))
    if not found and store.atomic:
        deeper = "" if kind in SUBSYSTEM_KINDS else "*/"
        return sorted(store.fs.glob(store.path(
            f"subsystem={subsystem}/*/kind={kind}/{deeper}*.parquet")))
    out: list[str] = []
    for path in sorted(found):
        body = json.loads(store.fs.cat_file(path))
        host = body["host_id"]
        for entry in body["sources"].values():
            if entry["kind"] != kind or not fnmatch.fnmatchcase(entry["subsystem"], subsystem):
                continue
            source = Source(entry["subsystem"], entry["kind"], entry.get("model", ""))
            out += [store.path(source.object_path(host, n)) for n in numbers(entry["ranges"])]
    return out
