"""`mlfs fleet train`: one policy from every host's rows, trained on a Dask cluster.

The rows are the fleet store's dataset portions of the subsystem (a name, or a
glob such as `linux.block.*` pooling devices with the same knobs), read with
`dask.dataframe.read_parquet`.  Each portion is one host's run of ticks, so
each partition is turned into training rows by the local learner itself
(`KnobLearner.training_rows`: decision-time features, knobs, label, weights),
and `lightgbm.dask.DaskLGBMRegressor` fits them with the learner's own
parameters: a fleet policy has the local policy's columns, target and format,
and the local proxy runs it like any uploaded policy.  Two simplifications,
both per portion rather than per host: the first row of a portion has no
predecessor and is dropped (1 row in `seal_rows`), and the per-setting weights
are computed within the portion.

Validation holds out whole hosts (leave one host out, for up to `folds`
hosts): the reported error is the error on a machine the model never saw.
Then the model is refitted on every host and published:
`policies/<S>/<N>.txt` (checked by the policy verifier first: what the
daemon would refuse is never published) and its card `<N>.json` (rows, hosts,
time range, validation error overall and per host, feature importances,
sha256 of the policy), the card last: a policy without a card is not
published, and pull (`mlfs train --fleet`) uses only a policy whose sha256
matches its card.

A subsystem with targets (a record source such as sim.disks) gets a predictor
instead: mlfs/fleet/predictors.py, with the local predictor trainer's rules.

Progress goes to `progress(line, final)` (the command prints it on stderr): portions
read n/N, alignment, fold k/N, fit; `dashboard` serves Dask's dashboard there.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import logging
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .kinds import FLEET_KINDS, kind_of, verify_policy
from .layout import (
    INFO,
    MAX_DOCUMENT_BYTES,
    MAX_VERSION,
    POLICIES,
    policy_path,
    policy_version,
)
from .store import Store

log = logging.getLogger("mlfs.fleet")

LABEL, WEIGHT, HOST = "__label", "__weight", "host_id"
#: a training label further than this many times the fleet's median magnitude is dropped
LABEL_BOUND = 1000.0
#: LightGBM's socket time-out in minutes (its default, 120, lets a run whose peer
#: died hang for two hours); 1 is the smallest it takes
NETWORK_TIMEOUT_MINUTES = 1
#: one fit may take this long before the run gives up (the 10 M-row bench fit
#: takes minutes on 2 workers; see docs/results/fleet.md)
FIT_TIMEOUT = 3600.0
#: how often the fit's watcher asks the scheduler which workers are alive
WATCH_SECONDS = 0.25
#: how long a failed fit waits for the scheduler to notice a worker that left (its cause)
GONE_GRACE_SECONDS = 5.0
#: seconds to reach a named scheduler
CONNECT_TIMEOUT = "30s"


class TrainError(Exception):
    """The run cannot publish a policy (str() says why, on one line)."""


def load_info(store: Store, pattern: str) -> dict:
    """The subsystems' `info` as most of their hosts shipped it (`load_infos`)."""
    return load_infos(store, pattern)[0]


def load_infos(store: Store, pattern: str) -> tuple[dict, set[tuple[str, str]]]:
    """The subsystems' `info` as their hosts shipped it, and the (subsystem, host) pairs
    that shipped it.  One host cannot stop training for everyone (red-team F13): an info
    that is unreadable, not JSON, not an object with knobs and features, or that
    disagrees with what most hosts shipped is ignored with a log line, and so are that
    host's rows.  A glob pools only devices with the same knobs."""
    found = [k for k in store.list(f"{INFO}/")
             if fnmatch.fnmatchcase(k, f"{INFO}/{pattern}/*.json") and k.count("/") == 2]
    if not found:
        raise TrainError(f"{store.url}: no {INFO}/{pattern}/<host>.json: nothing pushed yet")
    shapes: dict[str, list[tuple[tuple[str, str], dict]]] = {}
    for key in found:
        _, subsystem, name = key.split("/")
        try:
            info = json.loads(store.get(key, MAX_DOCUMENT_BYTES))
            shape = json.dumps([info["knobs"], info["features"]], sort_keys=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("%s: info ignored, and that host's rows: %s", key,
                      f"{type(exc).__name__}: {str(exc)[:160]}")
            continue
        shapes.setdefault(shape, []).append(((subsystem, name.removesuffix(".json")), info))
    if not shapes:
        raise TrainError(f"{store.url}: no readable {INFO}/{pattern}/<host>.json")
    chosen = max(shapes, key=lambda shape: len(shapes[shape]))  # the first of a tie
    for shape, entries in shapes.items():
        if shape != chosen:
            for (subsystem, host), _ in entries:
                log.error("%s/%s/%s.json: ignored, and that host's rows: its knobs or "
                          "features differ from %d other hosts' (train it apart)", INFO,
                          subsystem, host, len(shapes[chosen]))
    return shapes[chosen][0][1], {pair for pair, _ in shapes[chosen]}


def agreeing(paths: list[str], pairs: set[tuple[str, str]]) -> list[str]:
    """The object keys whose (subsystem, host) shipped the agreed info (`load_infos`)."""
    out = []
    for path in paths:
        parts = dict(p.split("=", 1) for p in path.split("/") if "=" in p)
        if (parts.get("subsystem"), parts.get("host")) in pairs:
            out.append(path)
    return out


def next_version(store: Store, subsystem: str, trusted: list | None = None) -> int:
    """The first free version past the newest that verifies (mlfs/fleet/pull.py):
    a forged 9999999999 never blocks the numbering, and no existing object, verified
    or not, is ever overwritten."""
    from .pull import newest_verified

    names = store.list(f"{POLICIES}/{subsystem}/")
    taken = {v[0] for v in map(policy_version, (n.rsplit("/", 1)[-1] for n in names)) if v}
    version = newest_verified(store, subsystem, trusted) + 1
    while version in taken:
        version += 1
    if version > MAX_VERSION:
        raise TrainError(f"policies/{subsystem}: version {version} would need 11 digits (a "
                         "version that verifies by its sha256 alone holds the last number: "
                         "sign the fleet's policies, --key, and only signed ones count)")
    return version


def utc(when: Any) -> pd.Timestamp:
    """A time as the dataset's `ts` (timestamp, UTC); a naive time is taken as UTC."""
    try:
        stamp = pd.Timestamp(when)
    except (ValueError, TypeError) as exc:
        raise TrainError(f"{when!r} is not a time (ISO 8601, e.g. 2026-12-01T04:00Z)") from exc
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def watched(client, work: Callable[[], Any], timeout: float, what: str) -> Any:
    """`work()` (a lightgbm.dask fit) in a thread, watched from here.

    lightgbm.dask pins one task to each worker that holds data
    (allow_other_workers=False): when such a worker dies, its task waits in the
    scheduler for a worker of that address forever, and the peers' LightGBM
    sockets wait up to their `time_out`.  So a worker leaving the cluster ends
    the fit at once (TrainError, nothing published), and so does `timeout`.
    """
    before = set(client.scheduler_info()["workers"])
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="fleet-fit", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        thread.join(WATCH_SECONDS)
        if not thread.is_alive():
            break
        try:
            gone = before - set(client.scheduler_info()["workers"])
        except Exception as exc:  # noqa: BLE001  (the scheduler itself went away)
            raise TrainError(f"{what}: lost the scheduler: {_one_line(exc)}") from exc
        if gone:
            raise TrainError(f"{what}: worker {', '.join(sorted(gone))} left the cluster "
                             "during training; nothing published")
        if time.monotonic() > deadline:
            raise TrainError(f"{what}: not done after {timeout:g} s; nothing published")
    if "error" in outcome:
        exc = outcome["error"]
        if isinstance(exc, TrainError):
            raise exc
        # A killed worker often fails its peers' LightGBM sockets before the scheduler
        # has noticed it gone: name the cause (the worker), not the symptom (a reset
        # socket), when the scheduler sees it leave within a short grace.
        gone = _left(client, before, GONE_GRACE_SECONDS)
        if gone:
            raise TrainError(f"{what}: worker {', '.join(sorted(gone))} left the cluster "
                             "during training; nothing published") from exc
        raise TrainError(f"{what} failed: {_one_line(exc)}; nothing published") from exc
    return outcome["value"]


def _left(client, before: set[str], grace: float) -> set[str]:
    """The workers of `before` the scheduler no longer lists, waiting up to `grace`
    seconds for it to notice (empty if none left, or the scheduler cannot say)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            gone = before - set(client.scheduler_info()["workers"])
        except Exception:  # noqa: BLE001  (the scheduler went away: the fit's error stands)
            return set()
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(WATCH_SECONDS)


def _quiet(line: str, final: bool = True) -> None:
    pass


class Progress:
    """Stage lines, each with the seconds since the start; a repeated stage (portions
    read n/N) at most once a second, and always its last line."""

    def __init__(self, write: Callable[[str], None], started: float) -> None:
        self.write = write
        self.started = started
        self.last = -math.inf

    def __call__(self, line: str, final: bool = True) -> None:
        now = time.perf_counter()
        if final or now - self.last >= 1.0:
            self.last = now
            self.write(f"{now - self.started:.1f} s: {line}")


def train(url: str, subsystem: str, scheduler: str | None = None, *, folds: int = 5,
          n_workers: int = 2, num_boost_round: int | None = None,
          since: pd.Timestamp | None = None, until: pd.Timestamp | None = None,
          fit_timeout: float = FIT_TIMEOUT, key: Path | None = None,
          progress: Callable[[str], None] | None = None,
          dashboard: str | None = None, kind: str | None = None) -> dict:
    """Train and publish one fleet policy of the subsystem's kind (`kinds.kind_of`:
    `kind`, else the first its hosts' `info` lists); returns its card.

    `since` / `until` keep the rows with `since <= ts < until` (applied as
    each portion is read on a worker).  Any failure of the cluster is a TrainError
    with a one-line reason, raised before anything is published.  `progress` gets
    one line per stage; `dashboard` (HOST:PORT) is where a LocalCluster serves
    Dask's dashboard (a named scheduler serves its own)."""
    started = time.perf_counter()
    if key is not None:  # a key refused for its mode or type: before hours of training
        from .signing import load_private

        load_private(key)
    say = Progress(progress, started) if progress else _quiet
    store = Store(url)
    info, pairs = load_infos(store, subsystem)
    try:
        name = kind_of(info, kind)
    except ValueError as exc:  # a kind the subsystem's hosts do not serve
        raise TrainError(f"{subsystem}: {exc}") from None
    chosen = FLEET_KINDS.get(name)
    if chosen is None:
        raise TrainError(f"{subsystem}: no fleet training for kind {name!r}")
    return chosen.load()(store, subsystem, info, pairs, scheduler, folds=folds,
                         n_workers=n_workers, num_boost_round=num_boost_round, since=since,
                         until=until, fit_timeout=fit_timeout, key=key, say=say,
                         dashboard=dashboard, started=started)


@contextlib.contextmanager
def _session(scheduler: str | None, n_workers: int, dashboard: str | None, local_cluster):
    """The cluster a round trains on (None: `scheduler`'s), closed and its scratch
    removed afterwards; whatever Dask or LightGBM raise inside is one TrainError line,
    and nothing is published."""
    cluster = scratch = None
    try:
        cluster, scratch = _cluster(scheduler, n_workers, dashboard, local_cluster)
        yield cluster
    except TrainError:
        raise
    except Exception as exc:  # noqa: BLE001  (Dask and LightGBM raise many types)
        raise TrainError(f"training on {scheduler or 'a LocalCluster'} failed: "
                         f"{_one_line(exc)}; nothing published") from exc
    finally:
        if cluster is not None:
            cluster.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _cluster(scheduler: str | None, n_workers: int, dashboard: str | None, local_cluster):
    """(LocalCluster or None, its scratch directory or None)."""
    if scheduler:
        return None, None
    # a LocalCluster's workers spill into dask-scratch-space under $TMPDIR and leave it
    # behind: give them a directory of their own and remove it with the cluster
    scratch = tempfile.mkdtemp(prefix="mlfs-fleet-train-")
    try:
        cluster = local_cluster(n_workers=n_workers, threads_per_worker=1,
                                dashboard_address=dashboard, processes=True,
                                local_directory=scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return cluster, scratch


def _announce(client, scheduler: str | None, dashboard: str | None, say) -> None:
    info = client.scheduler_info()
    where = scheduler or f"a LocalCluster of {len(info['workers'])} workers"
    # the link where a dashboard is served (a LocalCluster's with --dashboard, a named
    # scheduler's own); a LocalCluster without one still lists its HTTP server (metrics,
    # no dashboard pages), and Dask makes a link up from its configuration regardless
    served = "dashboard" in info.get("services", {})
    link = client.dashboard_link if served and (dashboard or scheduler) else None
    say(f"cluster: {where}" + (f", dashboard {link}" if link else ""))


def read_portion(url: str, path: str, columns: list[str], since, until) -> pd.DataFrame:
    """One portion's `columns`, the rows with `since <= ts < until` (a task on a worker)."""
    import pyarrow.parquet as pq

    store = Store(url)
    with store.open(path) as fh:
        frame = pq.read_table(fh, columns=columns).to_pandas()
    if since is not None or until is not None:
        ts = pd.to_datetime(frame["ts"], utc=True)
        keep = np.ones(len(frame), bool)
        if since is not None:
            keep &= (ts >= since).to_numpy()
        if until is not None:
            keep &= (ts < until).to_numpy()
        frame = frame[keep].reset_index(drop=True)
    return frame


def portion_futures(client, store: Store, paths: list[str], columns: list[str], since,
                    until, say) -> list:
    """Every portion read on the workers, one task each, counted as they end."""
    from distributed import as_completed

    futures = [client.submit(read_portion, store.url, path, columns, since, until,
                             pure=False) for path in paths]
    for done, _ in enumerate(as_completed(futures), start=1):
        say(f"portions read {done}/{len(futures)}", done == len(futures))
    return futures


def read_portions(client, store: Store, paths: list[str], columns: list[str], since, until,
                  say):
    """The portions as one Dask DataFrame, a part per portion (the parts are the read
    futures: a graph that re-read them through dd.read_parquet after a persisted one
    shared its keys and lost them, "cancelled for reason: lost dependencies")."""
    import dask.dataframe as dd

    futures = portion_futures(client, store, paths, columns, since, until, say)
    meta = futures[0].result().iloc[:0]
    return dd.from_delayed(futures, meta=meta, verify_meta=False)


def publish(store: Store, subsystem: str, text: str, card: Mapping[str, Any],
            key: Path | None = None) -> dict:
    """Publish `text` as the next policy version of `subsystem` with its card (version,
    sha256, creation time added); the card is written last, so a run that dies before
    it publishes nothing a host would use.  With `key` (an Ed25519 private key file) the
    card is signed first (`<N>.sig`, binding subsystem, version, sha256 and signer:
    mlfs/fleet/signing.py): hosts install only signed policies, and the version is one
    past the newest this key signed.  What the daemon's verifier refuses is never
    published (Refused); a private key readable by others is refused (SigningError)."""
    verify_policy(card.get("kind"), text)
    trusted = signer = None
    if key is not None:
        from .signing import key_id, load_private

        # number past what this key signed, never past what anyone could copy
        # into the store (F3): the key's own public half, not a file beside it
        public = load_private(key).public_key()
        trusted, signer = [public], key_id(public)
    version = next_version(store, subsystem, trusted)
    digest = hashlib.sha256(text.encode()).hexdigest()
    card = dict(card, version=version, subsystem=subsystem,
                policy=policy_path(subsystem, version, "txt").rsplit("/", 1)[-1],
                sha256=digest, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if signer is not None:
        card["signer"] = signer
    card_bytes = (json.dumps(card, indent=2) + "\n").encode()
    store.put(policy_path(subsystem, version, "txt"), text.encode())
    if key is not None:
        from .signing import sign_policy

        store.put(policy_path(subsystem, version, "sig"),
                  sign_policy(key, subsystem, version, digest, card_bytes))
    store.put(policy_path(subsystem, version, "json"), card_bytes)  # last
    return card
