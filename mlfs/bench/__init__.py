"""`mlfs bench`: what the exchange costs a user, as ratios to same-run references.

The machine this runs on is shared and noisy, so no figure is reported alone:
every throughput or latency is paired with a reference measured in the same
run, interleaved with it (reference, then mount, rep after rep), repeated, and
reported as median with min-max (and quartiles in the JSON).  Ratios are
always "speed through mlfs / speed of the reference" (1.0 = as fast as the
reference, higher is better), computed per interleaved pair, so drift on the
machine cancels out instead of landing on one side.

What is measured, and against what (the issue's table):

- dataset read, first and repeated: a >= 256 MiB portion (64 MiB with
  --quick) written into the state directory before mounting (the store
  recovers it) and read through the mount, against the same file read from
  the state directory, warm.  Each "first" repetition is a new mount: a new
  FUSE superblock has an empty page cache, while the state file stays warm.
- Polars and DuckDB queries over `dataset/*.parquet`, against the same query
  on the state directory's files.
- control write round trip: open/write/close of a recommendation, p50/p99,
  against the same on a tmpfs file; and once more with the state directory
  on tmpfs (a diagnostic row: the same FUSE path without a disk fsync).
- event wake-up: a recommendation write to a separate poll()ing process's
  line, p50/p99 (both sides stamp CLOCK_MONOTONIC, which is system-wide),
  against the same poller woken through a FIFO (this machine's wake-up cost,
  now).
- ingest: `SubsystemRuntime.tick()` + sealing in-process, against pyarrow
  writing the same rows to files in the same batches.
- record ingest: a batch record source's batches (sim.disks) through a record
  store into a sealed portion, against pyarrow alone writing the same batches with the
  same row groups and compression (issue 31's definition).
- per-request capture: linux.bio under fio (random 4 KiB direct reads, queue depth 32)
  on a loop device: records against the requests the device completed and fio's
  total_ios, records lost, fio's IOPS with the capture on against off (interleaved), the
  daemon's CPU per 100k requests/s; root, fio and the BPF toolchain, or the row says
  which is missing.
- footprint: daemon CPU and RSS from /proc/<pid> with three subsystems at one
  tick per second.
- concurrency: 32 dataset readers, 8 event readers and 1 recommendation writer
  at once; no error, no lost event, no wedge.

Every mount the bench starts is ended by its pid and unmounted; the temporary
directory is removed, also on Ctrl-C.

The package, by concern: `plan` (what is measured how often), `stats`
(percentiles, the row), `harness` (progress, mounts, the session), `data`
(the big portion), one module per group of benchmarks (`reads`, `latency`,
`ingest`, `records`, `capture`, `footprint`, `concurrency`), `report` (the table) and `run` (the
whole run).  The command line is mlfs.cli.bench.
"""

from .run import main, run

__all__ = ["main", "run"]
