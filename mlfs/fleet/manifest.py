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
manifests, or by hand).  A manifest names objects; it never makes them: the
objects a reader takes are those both a manifest names and a listing of the
host's own prefix shows, so what a forged manifest costs is bounded by what its
host really shipped (red-team F12: 200 sources of `[[0, 9999999]]` in 22 KB
expanded to 2x10^9 paths and ran `fleet train` out of memory).
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import logging

from mlfs.abi import NAME

from .layout import KINDS, SUBSYSTEM_KINDS, Source, portion_number
from .store import Store

log = logging.getLogger("mlfs.fleet")

#: the highest portion number a manifest may name (10 digits) and the most portions one
#: source may list: a manifest past either is refused, never expanded
MAX_PORTION = 9_999_999_999
MAX_PORTIONS_PER_SOURCE = 10_000_000
#: the most sources one manifest may name (a host has a few subsystems and models)
MAX_SOURCES = 4096
#: the largest manifest read (a source's ranges are a few pairs; thousands of sources)
MAX_MANIFEST_BYTES = 16 << 20


class ManifestError(ValueError):
    """A manifest that is not one (str() says why)."""


def path_host(path: str) -> str | None:
    """The host of an object's path (its `host=<H>` partition), None if it has none."""
    for part in path.split("/"):
        if part.startswith("host="):
            return part[len("host="):]
    return None


def consistent(store: Store, paths: list[str]) -> list[str]:
    """The objects whose rows all carry the host their path names (the `host_id` column's
    Parquet statistics): rows copied under another host's name are ignored, logged."""
    import pyarrow.parquet as pq

    out = []
    for path in paths:
        host = path_host(path)
        try:
            with store.open(path) as fh:
                meta = pq.ParquetFile(fh).metadata
                index = meta.schema.names.index("host_id")
                stats = [meta.row_group(i).column(index).statistics
                         for i in range(meta.num_row_groups)]
        except (OSError, ValueError) as exc:
            log.error("%s: object ignored: %s", path, str(exc)[:200])
            continue
        owners = {v for st in stats if st is not None and st.has_min_max
                  for v in (st.min, st.max)}
        if owners and owners != {host}:
            log.error("%s: object ignored: its rows name host %s, its path %r", path,
                      ", ".join(sorted(map(repr, owners)))[:200], host)
            continue
        out.append(path)
    return out


def checked(body: object, host: str) -> dict:
    """A manifest's body checked whole against its file name's host: types, names by
    the NAME rule (no `..`, no `/`), kinds, and ranges within what a store can hold."""
    if not isinstance(body, dict):
        raise ManifestError("not a JSON object")
    if body.get("host_id") != host or not NAME.fullmatch(host):
        raise ManifestError(f"host_id {str(body.get('host_id'))[:40]!r} is not the file's "
                            f"{host[:40]!r}")
    sources = body.get("sources")
    if not isinstance(sources, dict):
        raise ManifestError("sources is not an object")
    if len(sources) > MAX_SOURCES:
        raise ManifestError(f"{len(sources)} sources, over {MAX_SOURCES}")
    out = {}
    for key, entry in sources.items():
        if not isinstance(entry, dict):
            raise ManifestError(f"source {str(key)[:40]!r} is not an object")
        subsystem, kind, model = entry.get("subsystem"), entry.get("kind"), entry.get("model", "")
        if not isinstance(subsystem, str) or not NAME.fullmatch(subsystem):
            raise ManifestError(f"subsystem {str(subsystem)[:40]!r} is not a name")
        if kind not in KINDS:
            raise ManifestError(f"kind {str(kind)[:40]!r} is not one of {', '.join(KINDS)}")
        if not isinstance(model, str) or (model and not NAME.fullmatch(model)):
            raise ManifestError(f"model {str(model)[:40]!r} is not a name")
        ranges = entry.get("ranges")
        if not isinstance(ranges, list):
            raise ManifestError(f"{subsystem}/{kind}: ranges is not a list")
        total, floor = 0, -1
        for pair in ranges:
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)
                    and floor < pair[0] <= pair[1] <= MAX_PORTION):
                raise ManifestError(f"{subsystem}/{kind}: range {str(pair)[:40]} is not "
                                    f"[lo, hi] with {floor} < lo <= hi <= {MAX_PORTION} "
                                    "(sorted, disjoint)")
            total += pair[1] - pair[0] + 1
            floor = pair[1]
        if total > MAX_PORTIONS_PER_SOURCE:
            raise ManifestError(f"{subsystem}/{kind}: {total} portions listed, over "
                                f"{MAX_PORTIONS_PER_SOURCE}")
        out[key] = {"subsystem": subsystem, "kind": kind, "model": model, "ranges": ranges}
    return {"host_id": host, "sources": out}

MANIFESTS = "manifests"


def manifest_path(host: str) -> str:
    return f"{MANIFESTS}/{host}.json"


def add(ranges: list[list[int]], number: int) -> None:
    """Record `number` (shipped in increasing order per source) in sorted ranges."""
    if ranges and ranges[-1][1] + 1 == number:
        ranges[-1][1] = number
    elif not ranges or ranges[-1][1] < number:
        ranges.append([number, number])


def document(host: str, ranges: dict[str, list[list[int]]], sources: dict[str, Source]) -> bytes:
    body = {"host_id": host, "sources": {
        key: {"subsystem": s.subsystem, "kind": s.kind, "model": s.model, "ranges": ranges[key]}
        for key, s in sorted(sources.items()) if ranges.get(key)}}
    return json.dumps(body, sort_keys=True).encode() + b"\n"


def objects(store: Store, subsystem: str, kind: str) -> list[str]:
    """Store keys of the complete shipped objects of `kind` whose subsystem matches
    `subsystem` (a name or glob), oldest first per host: those a manifest names and
    its host's prefix holds (the module's docstring)."""
    found = [k for k in store.list(f"{MANIFESTS}/") if k.count("/") == 1
             and k.endswith(".json")]
    if not found and store.atomic:
        deeper = "" if kind in SUBSYSTEM_KINDS else "*/"
        pattern = f"subsystem={subsystem}/*/kind={kind}/{deeper}*.parquet"
        return [k for k in store.list() if fnmatch.fnmatchcase(k, pattern)
                and k.count("/") == pattern.count("/")]
    out: list[str] = []
    seen: set[str] = set()  # a source named twice (under two keys) is listed once
    for key in found:
        host = key.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            body = checked(json.loads(store.get(key, MAX_MANIFEST_BYTES)), host)
        except (ValueError, OSError) as exc:  # ManifestError, TooLarge, JSON errors
            log.error("%s: manifest ignored: %s", key, str(exc)[:200])
            continue
        for entry in body["sources"].values():
            if entry["kind"] != kind or not fnmatch.fnmatchcase(entry["subsystem"], subsystem):
                continue
            source = Source(entry["subsystem"], entry["kind"], entry.get("model", ""))
            if source.object_dir(host) in seen:
                continue
            seen.add(source.object_dir(host))
            out += [source.object_path(host, n)
                    for n in shipped(store, source, host, entry["ranges"])]
    return out


def shipped(store: Store, source: Source, host: str, ranges: list[list[int]]) -> list[int]:
    """The portion numbers both in `ranges` and in the store under the host's prefix."""
    lows = [lo for lo, _ in ranges]
    prefix = source.object_dir(host)
    out = []
    for key in store.list(prefix + "/"):
        if key.count("/") != prefix.count("/") + 1:
            continue
        number = portion_number(key.rsplit("/", 1)[-1])
        if number is None:
            continue
        at = bisect.bisect_right(lows, number) - 1
        if at >= 0 and ranges[at][0] <= number <= ranges[at][1]:
            out.append(number)
    return sorted(out)
