"""Observability: /metrics over HTTP (and a real Prometheus), `mlfs status`, `mlfs report`.

One module-scoped mount serves every mount test here (each test makes its own
model and removes it); it seals the dataset only on `prepare_dataset`, so a
test that counts rows and then reads a report sees the same portions.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import trio

from mlfs import http as mlfs_http
from mlfs.config import parse_config
from tests.harness import (
    REPO,
    Models,
    Mount,
    fuse_unavailable,
    mlfs_command,
    read_rows,
    unmount_everything_under,
    wait_for,
    write_errno,
)

PROMETHEUS = "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def observed_config(port: int) -> str:
    return f"""
[mount]
allow_other = true
metrics_port = {port}

[store]
seal_rows = 100000
seal_seconds = 3600.0
feedback_seal_seconds = 0.5
journal_seal_seconds = 1.0

[modes]
silence_seconds = 600.0

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 1
tick_seconds = 0.02
"""


@pytest.fixture(scope="module")
def observed():
    """A mount serving /metrics on a free loopback port; yields (Mount, port)."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mlfs-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    port = free_port()
    m = Mount(root, observed_config(port))
    m.start()
    try:
        yield m, port
    finally:
        m.kill(signal.SIGTERM)
        unmount_everything_under(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def models(observed):
    """Models a test makes; stopped (so the knob is free) but not removed at teardown.

    Not `rmdir`: removing a model while the daemon seals one of its feedback or
    journal portions crashes the daemon (`KeyError: 'store not owned'` from
    `Exchange._announce`, reported to the lead); the mount goes at teardown anyway.
    """
    made = Models(observed[0].sub)
    yield made
    for path in made.made:
        write_errno(path / "control", b"stop\n")


def metric_names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def run_mlfs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command(*args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def efficiency_known(model: Path) -> bool:
    text = (model / "efficiency").read_text().strip()
    return text != "nan" and float(text) > 0


# ---- configuration and the HTTP server on its own (no mount needed) --------------------------
def test_metrics_port_is_off_by_default_loopback_and_checked():
    mount = parse_config("", "t").mount
    assert (mount.metrics_port, mount.metrics_address) == (0, "127.0.0.1")
    assert parse_config("[mount]\nmetrics_port = 9464\n", "t").mount.metrics_port == 9464
    with pytest.raises(ValueError, match="metrics_port"):
        parse_config("[mount]\nmetrics_port = 70000\n", "t")
    with pytest.raises(ValueError, match="metrics_port"):
        parse_config('[mount]\nmetrics_port = "9464"\n', "t")


def test_http_server_answers_get_head_and_refuses_the_rest():
    calls = []

    def render() -> str:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return "mlfs_up 1\n"

    async def exchange(port: int, request: bytes) -> bytes:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
            return data

    async def main() -> dict:
        out = {}
        async with trio.open_nursery() as nursery:
            # min_interval 0: every scrape renders (the third one fails)
            host, port = await nursery.start(
                functools.partial(mlfs_http.serve_metrics, min_interval=0), render,
                "127.0.0.1", 0)
            assert host == "127.0.0.1"
            idle = await trio.open_tcp_stream("127.0.0.1", port)  # says nothing at all
            get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
            out["get"] = await exchange(port, get)
            out["head"] = await exchange(port, b"HEAD /metrics?x=1 HTTP/1.1\r\n\r\n")
            out["error"] = await exchange(port, get)
            out["root"] = await exchange(port, b"GET / HTTP/1.1\r\n\r\n")
            out["post"] = await exchange(port, b"POST /metrics HTTP/1.1\r\n\r\n")
            out["junk"] = await exchange(port, b"\x00\xff junk\r\n\r\n")
            out["long"] = await exchange(port, b"GET /metrics HTTP/1.1\r\nX: "
                                         + b"a" * 10000 + b"\r\n\r\n")
            await idle.aclose()
            nursery.cancel_scope.cancel()
        return out

    out = trio.run(main)
    head, _, body = out["get"].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in head
    assert b"Connection: close" in head and b"Content-Length: 10" in head
    assert body == b"mlfs_up 1\n"
    assert out["head"].startswith(b"HTTP/1.1 200") and out["head"].endswith(b"\r\n\r\n")
    assert b"Content-Length: 10" in out["head"]
    assert out["error"].startswith(b"HTTP/1.1 500")
    assert out["root"].startswith(b"HTTP/1.1 200") and b'href="/metrics"' in out["root"]
    assert out["post"].startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in out["post"]
    assert out["junk"].startswith(b"HTTP/1.1 400")
    assert out["long"].startswith(b"HTTP/1.1 413")


def test_http_server_that_cannot_listen_logs_and_returns(caplog):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()

    async def main():
        async with trio.open_nursery() as nursery:
            return await nursery.start(mlfs_http.serve_metrics, str, "127.0.0.1",
                                       busy.getsockname()[1])

    try:
        assert trio.run(main) is None  # the mount carries on without /metrics over HTTP
    finally:
        busy.close()
    assert "metrics over HTTP disabled" in caplog.text


# ---- the daemon --------------------------------------------------------------------------------
def _listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


def test_daemon_serves_the_metrics_file_over_http_on_loopback(observed, models):
    mount, port = observed
    model = models("http")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    wait_for(lambda: efficiency_known(model), what="an efficiency")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert answer.headers["Connection"] == "close"
        served = answer.read().decode()
    in_file = (mount.mountpoint / "metrics").read_text()
    assert metric_names(served) == metric_names(in_file)
    assert {"mlfs_ticks_total", "mlfs_model_efficiency", "mlfs_model_mode"} <= metric_names(
        served)
    assert 'mlfs_model_efficiency{subsystem="sim.readahead",model="http"}' in served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as landing:
        assert b'href="/metrics"' in landing.read()  # a landing page, as node_exporter's
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
    assert missing.value.code == 404
    assert _listening(port) == ["0100007F"], "only 127.0.0.1 by default"


def test_prometheus_scrapes_the_daemon_and_answers_model_efficiency(observed, models,
                                                                     tmp_path):
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip("needs Prometheus: apt-get install prometheus")
    _, port = observed
    model = models("prom")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    wait_for(lambda: efficiency_known(model), what="an efficiency")
    web = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: mlfs
    static_configs:
      - targets: ["127.0.0.1:{port}"]
""")
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    promql = urllib.parse.quote('mlfs_model_efficiency{subsystem="sim.readahead",model="prom"}')
    query = f"http://127.0.0.1:{web}/api/v1/query?query={promql}"

    def scraped():
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(query, timeout=5) as answer:
                result = json.load(answer)["data"]["result"]
        except (OSError, ValueError):
            return None
        if result and math.isfinite(float(result[0]["value"][1])):
            return result[0]
        return None

    try:
        # static targets reach the scrape manager after Prometheus' 5 s discovery batching
        found = wait_for(scraped, timeout=40, interval=0.25,
                         what="mlfs_model_efficiency in Prometheus")
    finally:
        prom.terminate()  # by its pid
        try:
            prom.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(timeout=5)
        log.close()
    assert found["metric"]["job"] == "mlfs"
    assert float(found["value"][1]) > 0


# ---- mlfs status --------------------------------------------------------------------------------
SPARK = set("▁▂▃▄▅▆▇█")


def test_status_shows_modes_trend_errors_and_knobs_against_defaults(observed, models):
    mount, _ = observed
    sub = mount.sub
    model = models("view")
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    wait_for(lambda: (model / "state").read_text() == "running\n", what="an ML tick")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    wait_for(lambda: len(read_rows(model / "feedback")) >= 20, what="feedback rows")
    assert write_errno(model / "recommend", b"no_such_knob=1\n") != 0
    assert write_errno(sub / "control", b"prepare_dataset\n") == 0

    done = run_mlfs("status", str(mount.mountpoint))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["view"])
    assert lines[at].split()[1:4] == ["running", "collaboration", "pinned"]
    lines = lines[at:]  # the model's own lines follow its row (earlier tests' models too)
    # the value in effect during the last tick: ML ticks 512, default ticks 128
    assert re.search(r"read_ahead_kb=(512 \(default 128\)|128 \(default\))", done.stdout)
    trend = next(line for line in lines if line.split()[:1] == ["trend"])
    assert SPARK & set(trend), trend
    modes = next(line for line in lines if line.split()[:1] == ["modes"])
    assert modes.index("learning") < modes.index("collaboration"), modes
    error = next(line for line in lines if line.split()[:1] == ["error"])
    assert "no_such_knob" in error

    shape = run_mlfs("status", str(mount.mountpoint), "--json")
    assert shape.returncode == 0, shape.stderr
    status = json.loads(shape.stdout)
    entry = status["subsystems"]["sim.readahead"]
    assert {"backend", "objective", "knobs", "portions", "models"} <= set(entry)
    m = entry["models"]["view"]
    assert {"state", "mode", "mode_switching", "efficiency", "knobs"} <= set(m)
    assert entry["knob_defaults"] == {"read_ahead_kb": 128}
    assert 0 < len(m["efficiency_trend"]) <= 40 and m["trend_ticks"] >= 20
    assert [run["mode"] for run in m["mode_history"]][-2:] == ["learning", "collaboration"]
    assert len(m["errors_tail"]) == 1 and "no_such_knob" in m["errors_tail"][0]


def test_status_watch_redraws_follows_mode_events_and_exits_0_on_ctrl_c(observed, models):
    mount, _ = observed
    model = models("watched")
    primary, secondary = pty.openpty()
    watcher = subprocess.Popen(mlfs_command("status", str(mount.mountpoint), "--watch", "0.2"),
                               stdout=secondary, stderr=subprocess.PIPE, cwd=REPO,
                               env={**os.environ, "TERM": "xterm", "COLUMNS": "200"},
                               # started with SIGINT ignored, as by a parent that ignores
                               # it (the suite's process did, once): Ctrl-C still ends it
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    os.close(secondary)
    screen = bytearray()

    def pump() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the watcher closed the terminal
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        wait_for(lambda: b"watched" in screen, timeout=20, what="a first frame")
        assert write_errno(model / "mode", b"recommendation\n") == 0
        wait_for(lambda: b"pinned by a write to mode" in screen, timeout=20,
                 what="the mode event's reason on screen")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=20) == 0, watcher.stderr.read()
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        reader.join(timeout=5)
        os.close(primary)
        watcher.stderr.close()
    text = screen.decode(errors="replace")
    assert text.startswith("\x1b[H\x1b[2J"), "the first frame clears the screen"
    assert text.count("\x1b[H") >= 2, "redrawn in place"
    assert "Traceback" not in text


# ---- mlfs report --------------------------------------------------------------------------------
def test_report_is_one_html_file_with_a_point_per_dataset_row(observed, models, tmp_path):
    mount, _ = observed
    sub = mount.sub
    model = models("rep")
    for mode, knob in (("learning", 1024), ("collaboration", 256), ("recommendation", 2048)):
        assert write_errno(model / "mode", f"{mode}\n".encode()) == 0
        assert write_errno(model / "recommend", f"read_ahead_kb={knob}\n".encode()) == 0
        wait_ml_ticks(mount, "rep", 3)  # the mode shows in ML rows
    try:
        import matplotlib  # noqa: F401
        png = ("--png",)
    except ImportError:  # test_operator_cli.py: --png without it exits 2
        png = ()

    out = tmp_path / "run.html"
    done = run_mlfs("report", str(mount.mountpoint), "sim.readahead", "--model", "rep",
                    "--all", "--out", str(out), *png)
    assert done.returncode == 0, done.stderr
    rows = read_rows(sub / "dataset")  # the report sealed them (seal_seconds is an hour)
    ours = [r for r in rows if r["model"] == "rep"]
    changes = sum(1 for a, b in zip(ours, ours[1:], strict=False) if a["mode"] != b["mode"])
    assert changes >= 2, "pinned learning -> collaboration -> recommendation"
    assert f"{changes} mode changes" in done.stdout, done.stdout
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert not re.search(r'<(script|link|img)\b|src="http', page), "self-contained"
    objective = re.search(r'<svg class="chart objective-chart"[^>]*>.*?</svg>', page, re.S)
    assert objective, "the objective chart"
    svg = objective.group(0)
    assert svg.count('<circle class="pt ') == len(rows)  # every row, under --max-points
    assert f'data-rows="{len(rows)}" data-points="{len(rows)}"' in svg
    assert svg.count('class="pt ml"') == sum(1 for r in rows if r["controller"] == "ml"
                                              and r["model"] == "rep")
    assert svg.count('class="mode-change"') == changes
    assert "→ collaboration" in svg and "→ recommendation" in svg
    assert 'class="chart efficiency-chart"' in page and 'class="weff"' in page
    if png:
        assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")

    # without --all: the model's run, from 500 rows before its first; past --max-points
    # every k-th row is drawn, and the page says so (the run has more rows than 20 when
    # this test runs first in its module too)
    wait_ml_ticks(mount, "rep", 30)
    small = tmp_path / "small.html"
    done = run_mlfs("report", str(mount.mountpoint), "sim.readahead", "--model", "rep",
                    "--out", str(small), "--max-points", "20")
    assert done.returncode == 0, done.stderr
    rows = read_rows(sub / "dataset")  # sealed again by this report
    first = next(i for i, r in enumerate(rows) if r["model"] == "rep")
    run = rows[first - 500:] if first > 500 else rows
    stride = math.ceil(len(run) / 20)
    assert stride > 1, "more rows than --max-points"
    drawn = len(run[::stride])
    page = small.read_text()
    assert f'data-rows="{len(run)}" data-points="{drawn}"' in page
    assert page.count('<circle class="pt ') == drawn <= 20
    assert f"1 row in {stride} ({drawn} of {len(run)};" in page


def wait_ml_ticks(mount, model: str, more: int) -> None:
    """Wait until `model` ran `more` further ML ticks (mlfs_model_ml_ticks_total)."""
    pattern = re.compile(r'^mlfs_model_ml_ticks_total\{[^}]*model="' + re.escape(model)
                         + r'"[^}]*\} (\S+)$', re.M)

    def count() -> int:
        found = pattern.search((mount.mountpoint / "metrics").read_text())
        assert found, f"no ML tick counter for {model}"
        return int(float(found.group(1)))

    target = count() + more
    wait_for(lambda: count() >= target, what=f"{more} ML ticks of {model}")


def test_report_shows_the_efficiency_files_number_for_the_same_rows(observed, models,
                                                                    tmp_path):
    """One definition (mlfs/core/models/efficiency.py): the report replays the rows it saw."""
    mount, _ = observed
    model = models("same")
    # the ML share changes (10 % -> 50 %) while the workload's phases change: where a mean
    # over ML ticks against a mean over default ticks of the window would drift from it
    assert write_errno(model / "mode", b"learning\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    wait_for(lambda: efficiency_known(model), what="an efficiency")
    wait_ml_ticks(mount, "same", 12)  # ~2.5 s of learning (a share of 0.1, 50 ticks/s)
    assert write_errno(model / "mode", b"collaboration\n") == 0
    wait_ml_ticks(mount, "same", 60)  # ~2.5 s of collaboration (0.5)
    assert write_errno(model / "control", b"stop\n") == 0  # the window holds still
    shown = (model / "efficiency").read_text().strip()
    assert write_errno(mount.sub / "control", b"prepare_dataset\n") == 0
    out = tmp_path / "same.html"
    done = run_mlfs("report", str(mount.mountpoint), "sim.readahead", "--model", "same",
                    "--out", str(out))
    assert done.returncode == 0, done.stderr
    cell = re.search(r"<th>window efficiency at the end</th><td>([^<]*)</td>",
                     out.read_text())
    assert cell and cell.group(1) == shown, (cell and cell.group(1), shown)


def test_report_explains_what_is_missing(observed, tmp_path):
    mount, _ = observed
    done = run_mlfs("report", str(mount.mountpoint), "no.such", "--out",
                    str(tmp_path / "x.html"))
    assert done.returncode == 1 and "sim.readahead" in done.stderr
    assert not (tmp_path / "x.html").exists()
