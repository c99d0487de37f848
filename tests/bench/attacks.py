"""The red-team table of issue 10: each attack tried on a real mount, one verdict each.

Run as root from a checkout (the code tried is the checkout's, or --repo's):

    .venv/bin/python tests/bench/attacks.py [--repo DIR] [--only NAME ...] [--json OUT]

Every attack starts its own mount in a temporary directory, ends every
process it started by its PID and unmounts whatever it mounted, also when the
daemon crashed or wedged.  A verdict says what a user would see: the errno of
the write, whether the daemon is alive and `version` still answers, whether a
mount comes up, and how many acknowledged rows came back after a restart.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _repo_from_argv() -> Path:
    if "--repo" in sys.argv:
        return Path(sys.argv[sys.argv.index("--repo") + 1]).resolve()
    return Path(__file__).resolve().parents[2]


REPO = _repo_from_argv()
sys.path.insert(0, str(REPO))

from tests.harness import FAST_CONFIG, Mount, mlfs_command, write_errno  # noqa: E402

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


# ---- small tools ---------------------------------------------------------------
def answers(mountpoint: Path, timeout: float = 5.0) -> bool:
    """`cat version` answers within `timeout` (a wedged mount does not)."""
    try:
        done = subprocess.run(["cat", str(mountpoint / "version")], capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and done.stdout.startswith(b"mlfs")


def health(m: Mount) -> str:
    if not m.alive():
        return "daemon DEAD"
    return "daemon alive, mount answers" if answers(m.mountpoint) else "daemon alive, WEDGED"


def errno_name(code: int | None) -> str:
    if code is None:
        return "no answer (timed out)"
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))


def write_with_timeout(path: Path, data: bytes, timeout: float = 20.0) -> int | None:
    """write_errno in a thread; None when the write did not return (wedged)."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(_write(path, data)), daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else None


def _write(path: Path, data: bytes) -> int:
    try:
        return write_errno(path, data)
    except OSError as exc:
        return exc.errno


def last_error(model: Path) -> str:
    """The model's last `errors` line, read with a timeout (the mount may be wedged)."""
    try:
        done = subprocess.run(["cat", str(model / "errors")], capture_output=True, text=True,
                              timeout=5)
    except subprocess.TimeoutExpired:
        return "errors did not answer"
    lines = done.stdout.strip().splitlines()
    return lines[-1].split(" ", 2)[-1][:110] if lines else ""


def force_down(m: Mount) -> None:
    """Kill the daemon by its pid, even when wedged, and clear its mountpoint."""
    if m.pid is not None and m.alive():
        os.kill(m.pid, signal.SIGKILL)
    m.kill(signal.SIGKILL, timeout=10)
    subprocess.run(["fusermount3", "-u", "-z", str(m.mountpoint)], capture_output=True)


def try_start(m: Mount) -> tuple[bool, str]:
    done = subprocess.run(
        mlfs_command("mount", str(m.mountpoint), "--config", str(m.config_path),
                     "--state-dir", str(m.state_dir)),
        capture_output=True, text=True, timeout=60, cwd=REPO)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return False, f"exit {done.returncode}: {lines[-1][:100] if lines else ''}"
    m.adopt(int((m.state_dir / "mlfs.pid").read_text()))
    return True, "mounted"


def journal_rows(state_dir: Path, model: str) -> list[dict]:
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for portion in sorted((state_dir / "sim.readahead" / "models" / model /
                           "recommendations").glob("*.parquet")):
        rows += pq.read_table(portion).to_pylist()
    return rows


class Workspace:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mlfs-attack-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.mounts: list[Mount] = []
        self.procs: list[subprocess.Popen] = []
        self.tmpfs: list[Path] = []

    def mount(self, config: str = FAST_CONFIG, start: bool = True) -> Mount:
        m = Mount(self.root, config, name=f"mnt{len(self.mounts)}")
        self.mounts.append(m)
        if start:
            m.start()
        return m

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for m in self.mounts:
            force_down(m)
        for path in self.tmpfs:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


# ---- policies ------------------------------------------------------------------
def valid_policy(m: Mount) -> str:
    """A small real LightGBM model over the subsystem's own columns (3 leaves a tree)."""
    import lightgbm as lgb
    import numpy as np

    info = json.loads((m.sub / "info").read_text())
    columns = list(info["features"]) + ["knob_read_ahead_kb"]
    rng = np.random.default_rng(0)
    x = rng.random((400, len(columns)))
    x[:, -1] = rng.choice([0, 128, 1024], 400)
    y = x[:, 0] * 100 + (x[:, -1] > 100) * 50
    data = lgb.Dataset(x, y, feature_name=columns)
    booster = lgb.train({"num_leaves": 3, "verbose": -1, "min_data_in_leaf": 5}, data,
                        num_boost_round=2)
    return booster.model_to_string()


def mutate_first_tree(text: str, field: str, value: str) -> str:
    """Change one field of tree 0; drop `tree_sizes` so LightGBM parses the trees in order."""
    head, sep, rest = text.partition("Tree=0\n")
    head = re.sub(r"^tree_sizes=.*\n", "", head, flags=re.M)
    rest = re.sub(rf"^{field}=.*$", f"{field}={value}", rest, count=1, flags=re.M)
    return head + sep + rest


def model_dir(m: Mount, name: str = "red") -> Path:
    model = m.sub / "models" / name
    model.mkdir()
    assert write_errno(model / "control", b"start\n") == 0
    return model


# ---- the attacks -----------------------------------------------------------------
def attack_policy(ws: Workspace, field: str, value: str) -> str:
    m = ws.mount()
    model = model_dir(m)
    text = mutate_first_tree(valid_policy(m), field, value)
    code = write_with_timeout(model / "policy", text.encode(), timeout=30)
    time.sleep(1.0)  # a policy runs on the next ML ticks
    state = health(m)
    return f"write: {errno_name(code)} ({last_error(model)}); {state}"


def attack_policy_feature(ws: Workspace) -> str:
    return attack_policy(ws, "split_feature", "0 100000000")


def attack_policy_cycle(ws: Workspace) -> str:
    return attack_policy(ws, "right_child", "1 0")


def attack_truncated_saved_policy(ws: Workspace) -> str:
    m = ws.mount()
    model = model_dir(m)
    code = write_errno(model / "policy", valid_policy(m).encode())
    m.umount()
    saved = m.state_dir / "sim.readahead" / "models" / "red" / "policy.txt"
    if code != 0 or not saved.exists():
        return f"setup failed: upload {errno_name(code)}"
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    ok, how = try_start(m)
    if not ok:
        return f"remount: {how}"
    time.sleep(1.0)
    policy = (model / "policy").read_bytes() if answers(m.mountpoint) else b"?"
    aside = sorted(p.name for p in saved.parent.glob("policy.txt.damaged*"))
    return (f"remount: {how}; {health(m)}; policy loaded: {bool(policy)}; "
            f"set aside: {aside or 'nothing'}")


def attack_disk_full(ws: Workspace) -> str:
    state = ws.root / "small-state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state)], check=True)
    ws.tmpfs.append(state)
    m = ws.mount(start=False)
    m.state_dir = state / "s"
    m.start()
    model = model_dir(m)
    acked = 0
    for i in range(20):
        acked += write_errno(model / "recommend", f"read_ahead_kb={128 + i}\n".encode()) == 0
    filler = state / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
    time.sleep(3.0)
    during = health(m)
    codes = []
    if m.alive() and answers(m.mountpoint):
        for i in range(20):
            code = write_with_timeout(model / "recommend", f"read_ahead_kb={256 + i}\n".encode(),
                                      timeout=10)
            codes.append(code)
            acked += code == 0
        prep = write_with_timeout(m.sub / "control", b"prepare_dataset\n", timeout=30)
    else:
        prep = None
    filler.unlink()
    time.sleep(3.0)
    after = health(m)
    if m.alive() and answers(m.mountpoint):
        later = write_with_timeout(model / "recommend", b"read_ahead_kb=512\n", timeout=10)
        acked += later == 0
        m.umount()
    else:
        later = None
        force_down(m)
    ok, _ = try_start(m)
    kept = len([r for r in journal_rows(m.state_dir, "red") if r["status"] == "accepted"])
    seen = sorted({errno_name(c) for c in codes}) or ["-"]
    return (f"full: {during}; recommend {'/'.join(seen)}; prepare_dataset {errno_name(prep)}; "
            f"space back: {after}, recommend {errno_name(later)}; remount {ok}; "
            f"acknowledged {acked}, in journal {kept}")


def attack_ttl_overflow(ws: Workspace) -> str:
    m = ws.mount()
    model = model_dir(m)
    acked = 0
    for i in range(10):
        acked += write_errno(model / "recommend", f"read_ahead_kb={128 + i}\n".encode()) == 0
    code = write_errno(model / "recommend",
                       b"read_ahead_kb=512 ttl=99999999999999999999999\n")
    acked += code == 0
    for i in range(10):
        acked += write_errno(model / "recommend", f"read_ahead_kb={256 + i}\n".encode()) == 0
    time.sleep(2.5)  # the journal seals every second here
    m.umount()
    ok, how = try_start(m)
    kept = len([r for r in journal_rows(m.state_dir, "red") if r["status"] == "accepted"])
    return (f"huge ttl: {errno_name(code)}; remount: {how}; acknowledged {acked}, "
            f"in journal after restart {kept}")


def attack_parked_readers(ws: Workspace, readers: int = 512) -> str:
    m = ws.mount()
    base = _latencies(m.mountpoint, 20)
    started = 0
    refused = 0
    for _ in range(readers):
        proc = subprocess.Popen([*NOBODY, "cat", str(m.mountpoint / "events")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ws.procs.append(proc)
        started += 1
    time.sleep(3.0)
    refused = sum(1 for p in ws.procs if p.poll() is not None)
    loaded = _latencies(m.mountpoint, 20)
    t0 = time.monotonic()
    done = subprocess.run(mlfs_command("umount", str(m.mountpoint)), capture_output=True,
                          timeout=120, cwd=REPO)
    took = time.monotonic() - t0
    for proc in ws.procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return (f"{started} nobody readers ({refused} refused: exited at once); root `cat version` "
            f"p50/max {base[0]:.0f}/{base[1]:.0f} ms idle -> {loaded[0]:.0f}/{loaded[1]:.0f} ms "
            f"parked; umount exit {done.returncode} in {took:.1f} s")


def _latencies(mountpoint: Path, count: int) -> tuple[float, float]:
    times = []
    for _ in range(count):
        t0 = time.monotonic()
        try:
            subprocess.run(["cat", str(mountpoint / "version")], capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:
            pass
        times.append((time.monotonic() - t0) * 1000)
    times.sort()
    return times[len(times) // 2], times[-1]


def attack_low_nofile(ws: Workspace) -> str:
    m = ws.mount()
    subprocess.run(["prlimit", f"--pid={m.pid}", "--nofile=48:48"], check=True)
    made, codes = [], []
    for i in range(60):
        try:
            (m.sub / "models" / f"m{i}").mkdir()
            made.append(f"m{i}")
        except OSError as exc:
            codes.append(exc.errno)
    time.sleep(2.0)
    state = health(m)
    prep = write_with_timeout(m.sub / "control", b"prepare_dataset\n", timeout=30)
    force_down(m)
    ok, _ = try_start(m)
    back = len(list((m.sub / "models").iterdir())) if ok and answers(m.mountpoint) else -1
    seen = sorted({errno_name(c) for c in codes}) or ["-"]
    return (f"mkdir: {len(made)} ok, failures {'/'.join(seen)}; {state}; prepare_dataset "
            f"{errno_name(prep)}; after restart {back} models (made {len(made)})")


def _remount_after(ws: Workspace, damage) -> str:
    m = ws.mount()
    model_dir(m)
    time.sleep(0.5)
    m.umount()
    damage(m.state_dir / "sim.readahead")
    ok, how = try_start(m)
    if not ok:
        return f"remount: {how}"
    aside = sorted(p.name for p in m.state_dir.rglob("*.damaged*"))
    aside += sorted(f"quarantine/{p.name}" for p in m.state_dir.rglob("quarantine/*"))
    return f"remount: {how}; {health(m)}; set aside: {aside or 'nothing'}"


def attack_damaged_wal(ws: Workspace) -> str:
    def damage(sub: Path) -> None:
        (sub / "dataset" / "wal.900.jsonl").write_text('[1,2,3]\n{"tick":"abc"}\n')
    return _remount_after(ws, damage)


def attack_damaged_model_json(ws: Workspace) -> str:
    def damage(sub: Path) -> None:
        (sub / "models" / "red" / "model.json").write_text('{"knobs": 5, "pinned": [1], '
                                                           '"state": 3}')
    return _remount_after(ws, damage)


def attack_damaged_counters(ws: Workspace) -> str:
    def damage(sub: Path) -> None:
        (sub / "tick_reserved").write_text("abc\n")
        (sub / "dataset" / "next_portion").write_text("-7x\n")
    return _remount_after(ws, damage)


def _config_mount(ws: Workspace, extra: str) -> str:
    config = FAST_CONFIG.replace("tick_seconds = 0.02", extra)
    m = ws.mount(config, start=False)
    ok, how = try_start(m)
    if not ok:
        return f"mount {how}"
    time.sleep(2.0)
    cpu = _cpu_share(m.pid, 2.0) if m.alive() else 0.0
    return f"mount: {how}; {health(m)}; daemon CPU {cpu:.0%}"


def _cpu_share(pid: int, seconds: float) -> float:
    def ticks() -> int:
        parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])
    try:
        before = ticks()
        time.sleep(seconds)
        return (ticks() - before) / os.sysconf("SC_CLK_TCK") / seconds
    except OSError:
        return 0.0


def attack_tick_zero(ws: Workspace) -> str:
    return _config_mount(ws, "tick_seconds = 0.0")


def attack_tick_nan(ws: Workspace) -> str:
    return _config_mount(ws, "tick_seconds = nan")


def attack_name_escape(ws: Workspace) -> str:
    target = ws.root / "escaped-here"
    config = FAST_CONFIG.replace('name = "sim.readahead"', f'name = "../../../{target}"')
    m = ws.mount(config, start=False)
    ok, how = try_start(m)
    escaped = target.exists() or Path(f"/{target.name}").exists()
    return f"mount: {how}; state written outside the state dir: {escaped}"


def _unmount_helpers(mountpoint: Path) -> list[int]:
    """The pids of the `auto_unmount` helpers (fusermount3) watching `mountpoint`.

    The helper's parent is the daemon (not init, as `pgrep -P 1` assumed: that found
    none, so the helper unmounted cleanly and no stale mountpoint was ever made)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"fusermount3") and str(mountpoint).encode() in argv:
            pids.append(int(proc.name))
    return pids


def attack_stale_mountpoint(ws: Workspace) -> str:
    m = ws.mount()
    helpers = _unmount_helpers(m.mountpoint)
    for pid in helpers:  # the auto_unmount helper, by its pid: no clean-up after the kill
        os.kill(pid, signal.SIGKILL)
    os.kill(m.pid, signal.SIGKILL)
    time.sleep(0.5)
    try:  # a listing, not a stat: the kernel answers a stat from its cached attributes
        os.listdir(m.mountpoint)
        stale = "not stale"
    except OSError as exc:
        stale = errno_name(exc.errno)
    m.pid = None
    ok, how = try_start(m)
    return f"mountpoint {stale}; mlfs mount: {how}; {health(m) if ok else ''}"


def attack_underscore_number(ws: Workspace) -> str:
    m = ws.mount()
    model = model_dir(m)
    obj = write_errno(m.sub / "objective", b"1_000\n")
    exp = write_errno(model / "recommend", b"read_ahead_kb=256 expect=1_000\n")
    return f"objective 1_000: {errno_name(obj)}; expect=1_000: {errno_name(exp)}"


def attack_operator_switch(ws: Workspace) -> str:
    m = ws.mount()
    model = model_dir(m)
    code = write_errno(m.mountpoint / "control", b"emergency\n") \
        if (m.mountpoint / "control").exists() else errno.ENOENT
    mode = (model / "mode").read_text().strip()
    write_errno(m.mountpoint / "control", b"auto\n") if code == 0 else None
    return f"echo emergency > MOUNT/control: {errno_name(code)}; model mode {mode}"


# ---- the second red-team pass's holes (issue 28) ------------------------------------
GROUP = FAST_CONFIG.replace("[mount]\n", '[mount]\ngroup = "nogroup"\n')
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _as_nobody(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, "bash", "-c", script], capture_output=True, text=True,
                          timeout=60)


def _install_stuck_plugin(site: Path) -> None:
    """The test suite's plugin whose constructor waits on a FIFO (a device probe that never
    answers).  The first version of this attack loaded linux.sysfs on /proc/kmsg, which the
    load's check now refuses before any backend is built: the stuck path went unexercised."""
    from tests.mount.test_plugins import STUCK, install_plugin

    install_plugin(site, "stuck.probe", "mlfs_stuck", STUCK)


def attack_stuck_load(ws: Workspace) -> str:
    site, fifo = ws.root / "site", ws.root / "probe"
    _install_stuck_plugin(site)
    os.mkfifo(fifo)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(site)
    try:
        m = ws.mount()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    model = model_dir(m)
    load = subprocess.Popen(["bash", "-c", f"echo 'load stuck.probe wait_for={fifo}' > "
                             + str(m.mountpoint / "control")],
                            stderr=subprocess.PIPE, text=True)
    ws.procs.append(load)
    deadline = time.monotonic() + 30
    while "mlfs_loads_waiting 1" not in (m.mountpoint / "metrics").read_text():
        if time.monotonic() > deadline:
            return f"the load never reached the backend; {health(m)}"
        time.sleep(0.05)
    started = time.monotonic()
    code = write_with_timeout(m.mountpoint / "control", b"emergency\n", timeout=20)
    took = time.monotonic() - started
    mode = (model / "mode").read_text().strip() if code == 0 else "?"
    write_with_timeout(m.mountpoint / "control", b"auto\n", timeout=20)
    with open(fifo, "w"):  # the probe answers at last: what it built is closed, never served
        pass
    return (f"emergency behind a stuck load: {errno_name(code)} in {took:.1f} s, model {mode}; "
            f"{health(m)}")


def attack_reserved_name(ws: Workspace) -> str:
    m = ws.mount()
    code = write_with_timeout(m.mountpoint / "control",
                              b"load sim.readahead name=emergency_pinned\n")
    pin = write_with_timeout(m.mountpoint / "control", b"emergency\n")
    auto = write_with_timeout(m.mountpoint / "control", b"auto\n")
    return (f"load name=emergency_pinned: {errno_name(code)}; then emergency {errno_name(pin)}, "
            f"auto {errno_name(auto)}")


def attack_group_kernel_write(ws: Workspace) -> str:
    m = ws.mount(GROUP)
    load = _as_nobody("echo 'load linux.vm name=x apply={vfs_cache_pressure=[100,101]}' > "
                      f"{m.mountpoint}/control")
    model = m.sub / "models" / "g"
    _as_nobody(f"mkdir {model}; echo start > {model}/control")
    pin = _as_nobody(f"echo recommendation > {model}/mode")
    write_with_timeout(m.mountpoint / "control", b"emergency\n")
    release = _as_nobody(f"echo auto > {m.mountpoint}/control")
    write_with_timeout(m.mountpoint / "control", b"auto\n")

    def said(done: subprocess.CompletedProcess) -> str:
        return "ok" if done.returncode == 0 else done.stderr.strip().rsplit(":", 1)[-1].strip()
    return (f"group: load with apply {said(load)}; pin recommendation {said(pin)}; "
            f"release root's pin {said(release)}")


def attack_cloned_host_id(ws: Workspace) -> str:
    config = FAST_CONFIG.replace("[mount]\n", '[mount]\nhost_id = "cloned"\n')
    a, b = ws.mount(config), ws.mount(config)
    store = ws.root / "store"
    codes = []
    for m in (a, b):
        write_with_timeout(m.sub / "control", b"prepare_dataset\n")
        done = subprocess.run([sys.executable, "-m", "mlfs", "fleet", "push", str(m.mountpoint),
                               "--store", str(store), "--state-dir", str(m.state_dir),
                               "--once"], capture_output=True, text=True, timeout=120,
                              cwd=REPO)
        codes.append(done.returncode)
    manifest = json.loads((store / "manifests" / "cloned.json").read_text())
    return f"push as the same host id from two state dirs: exit {codes}; manifest " \
        f"{sum(len(v['ranges']) for v in manifest['sources'].values())} range(s)"


def attack_forged_policy_version(ws: Workspace) -> str:
    """A forged 9999999999 whose card's sha256 matches and whose `.sig` the forger's own
    key made, beside a genuine signed version 1: the host must check the signature
    (--trusted-key) and start from version 1 (issue 50, note 3 of redteam3)."""
    from mlfs.fleet import signing

    m = ws.mount()
    store, key, pub = _signed_store(ws)
    text = valid_policy(m)
    genuine = _publish(store, text, key)
    folder = store / "policies" / "sim.readahead"
    forger = ws.root / "forger.key"
    signing.keygen(forger)
    import hashlib

    digest = hashlib.sha256(text.encode()).hexdigest()
    card = json.dumps({"version": 9_999_999_999, "subsystem": "sim.readahead",
                       "sha256": digest, "rows": 10**9, "validation": {"mae": 0}}).encode()
    (folder / "9999999999.txt").write_text(text)
    if hasattr(signing, "sign_policy"):
        forged = signing.sign_policy(forger, "sim.readahead", 9_999_999_999, digest, card)
    else:  # a checkout from before signature format 2 (the "before" column)
        forged = signing.sign(card, forger)
    (folder / "9999999999.sig").write_bytes(forged)
    (folder / "9999999999.json").write_bytes(card)
    return "forged 9999999999 signed by an untrusted key: " + \
        _fleet_verdict(ws, m, store, pub, {genuine["version"]: "genuine v1"})


# ---- signed replays (issue 50, F2-F4): a genuine signature under another name --------
def _signed_store(ws: Workspace) -> tuple[Path, Path, Path]:
    from mlfs.fleet.signing import keygen

    key = ws.root / "fleet.key"
    return ws.root / "store", key, keygen(key)


def _publish(store: Path, text: str, key: Path, subsystem: str = "sim.readahead") -> dict:
    from mlfs.fleet.store import Store
    from mlfs.fleet.train import publish

    return publish(Store(str(store)), subsystem, text, {"rows": 1}, key=key)


def _copy_policy(store: Path, subsystem: str, version: int, to_subsystem: str,
                 to_version: int) -> None:
    (store / "policies" / to_subsystem).mkdir(parents=True, exist_ok=True)
    for suffix in ("txt", "sig", "json"):
        shutil.copy(store / "policies" / subsystem / f"{version:010d}.{suffix}",
                    store / "policies" / to_subsystem / f"{to_version:010d}.{suffix}")


def _fleet_verdict(ws: Workspace, m: Mount, store: Path, pub: Path,
                   names: dict[int, str]) -> str:
    """`mlfs train --fleet --trusted-key`: which version it started from, or its refusal."""
    done = subprocess.run([sys.executable, "-m", "mlfs", "train", str(m.mountpoint),
                           "sim.readahead", "--fleet", str(store), "--trusted-key", str(pub),
                           "--max-seconds", "3"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    found = re.search(r"starting from fleet policy (\d+)", done.stderr)
    if found:
        version = int(found.group(1))
        return f"started from policy {version} ({names.get(version, 'a REPLAY')}), " \
            f"exit {done.returncode}"
    last = (done.stderr.strip().splitlines() or ["(nothing)"])[-1]
    return f"nothing installed, exit {done.returncode}: {last[-160:]}"


def attack_signed_rollback(ws: Workspace) -> str:
    """F2: genuine signed v1 and v2; v1's three files copied byte for byte to v3."""
    m = ws.mount()
    store, key, pub = _signed_store(ws)
    text = valid_policy(m)
    _publish(store, text, key)
    _publish(store, text.replace("\n\n", "\n\n\n", 1), key)
    _copy_policy(store, "sim.readahead", 1, "sim.readahead", 3)
    return "v1 copied to v3: " + _fleet_verdict(ws, m, store, pub, {2: "genuine newest v2"})


def attack_signed_last_number(ws: Workspace) -> str:
    """F3: v1 copied to 9999999999; then the publisher (with its key) publishes again."""
    m = ws.mount()
    store, key, pub = _signed_store(ws)
    text = valid_policy(m)
    _publish(store, text, key)
    _copy_policy(store, "sim.readahead", 1, "sim.readahead", 9_999_999_999)
    host = _fleet_verdict(ws, m, store, pub, {1: "genuine v1"})
    newer = text.replace("\n\n", "\n\n\n", 1)
    try:
        published = f"published v{_publish(store, newer, key)['version']}"
    except Exception as exc:  # the verdict is whether the publisher is blocked
        published = f"publisher BLOCKED: {type(exc).__name__}: {str(exc)[:100]}"
    return f"v1 copied to 9999999999: {host}; then {published}"


def attack_signed_cross_subsystem(ws: Workspace) -> str:
    """F4: a policy signed for another subsystem (same columns) copied under this one's."""
    m = ws.mount()
    store, key, pub = _signed_store(ws)
    _publish(store, valid_policy(m), key, subsystem="sim.other")
    _copy_policy(store, "sim.other", 1, "sim.readahead", 1)
    return "signed for sim.other, copied to sim.readahead/1: " + \
        _fleet_verdict(ws, m, store, pub, {})


ATTACKS = {
    "policy-feature-index": attack_policy_feature,
    "policy-cycle": attack_policy_cycle,
    "truncated-saved-policy": attack_truncated_saved_policy,
    "disk-full": attack_disk_full,
    "ttl-overflow": attack_ttl_overflow,
    "parked-readers": attack_parked_readers,
    "low-nofile": attack_low_nofile,
    "damaged-wal": attack_damaged_wal,
    "damaged-model-json": attack_damaged_model_json,
    "damaged-counters": attack_damaged_counters,
    "tick-seconds-0": attack_tick_zero,
    "tick-seconds-nan": attack_tick_nan,
    "name-escape": attack_name_escape,
    "stale-mountpoint": attack_stale_mountpoint,
    "number-1_000": attack_underscore_number,
    "operator-switch": attack_operator_switch,
    "stuck-load": attack_stuck_load,
    "reserved-name": attack_reserved_name,
    "group-kernel-write": attack_group_kernel_write,
    "cloned-host-id": attack_cloned_host_id,
    "forged-policy-version": attack_forged_policy_version,
    # issue 50: signed replays (F2-F4)
    "signed-rollback": attack_signed_rollback,
    "signed-last-number": attack_signed_last_number,
    "signed-cross-subsystem": attack_signed_cross_subsystem,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", help="the checkout whose code is attacked")
    parser.add_argument("--only", nargs="*", choices=list(ATTACKS), help="run these only")
    parser.add_argument("--json", type=Path, help="write the verdicts here as JSON")
    args = parser.parse_args()
    results = {}
    for name in args.only or list(ATTACKS):
        ws = Workspace()
        t0 = time.monotonic()
        try:
            verdict = ATTACKS[name](ws)
        except Exception as exc:  # the harness's own failure is a verdict too
            verdict = f"harness error: {type(exc).__name__}: {exc}"[:300]
        finally:
            ws.close()
        results[name] = verdict
        print(f"{name:24s} {verdict}  [{time.monotonic() - t0:.0f} s]", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"repo": str(REPO), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
