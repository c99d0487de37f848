"""Run-time loading (docs/ABI.md, the modprobe model): load/unload on MOUNT/control, mkdir/rmdir.

Real mounts, real loop devices, real kernel files: a loaded `linux.block`
subsystem changes the device's read_ahead_kb through a model, and unloading
puts the original back before its directory disappears; loads are
remembered across umount and SIGKILL; every refusal has its errno and a
reason in MOUNT/errors and changes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import (
    FAST_CONFIG,
    REPO,
    EventStream,
    Mount,
    fill,
    mlfs_command,
    read_ahead,
    recommend,
    sh,
    tmpfs,
    wait_blocked,
    wait_for,
    write_errno,
)

NOBODY = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
APPLY = "apply={read_ahead_kb=[16,4096]}"


def block_load(device: str) -> bytes:
    return (f'load linux.block devices=["{device}"] tick_seconds=0.1 measure_seconds=0.05 '
            f"{APPLY}\n").encode()


def control(m: Mount, command: str | bytes) -> int:
    data = command.encode() if isinstance(command, str) else command
    return write_errno(m.mountpoint / "control", data)


def errors(m: Mount) -> list[str]:
    return (m.mountpoint / "errors").read_text().splitlines()


def ticks(m: Mount, subsystem: str) -> int:
    line = f'mlfs_ticks_total{{subsystem="{subsystem}"}} '
    for text in (m.mountpoint / "metrics").read_text().splitlines():
        if text.startswith(line):
            return int(float(text.split()[-1]))
    raise AssertionError(f"no {line!r} in metrics")


def portions(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.parquet"))


def test_loaded_block_device_is_driven_then_unload_restores_it_and_removes_the_dir(mount, loop):
    original = read_ahead(loop)
    name = f"linux.block.{loop}"
    with EventStream(mount.mountpoint / "events") as events:
        assert control(mount, block_load(loop)) == 0
        loaded = events.wait_for(lambda e: e["event"] == "subsystem", what="loaded")
        assert (loaded["subsystem"], loaded["action"], loaded["source"]) == (name, "loaded", "load")
        assert name in os.listdir(mount.mountpoint)
        assert json.loads((mount.mountpoint / name / "info").read_text())["source"] == "load"
        recommend(mount, loop, 1024)
        wait_for(lambda: read_ahead(loop) == "1024", what="the recommendation applied")
        assert control(mount, f"unload {name}\n") == 0
        # restored before the write returned, and the directory is gone with it
        assert read_ahead(loop) == original
        assert name not in os.listdir(mount.mountpoint)
        # a cached entry lives out its entry timeout (1 s; nothing is invalidated)
        wait_for(lambda: not (mount.mountpoint / name).exists(), timeout=3,
                 what="the directory gone")
        gone = events.wait_for(lambda e: e["event"] == "subsystem", what="unloaded")
        assert (gone["subsystem"], gone["action"], gone["source"]) == (name, "unloaded", "load")
    assert (mount.state_dir / name / "dataset").is_dir()  # its portions stay
    assert not json.loads((mount.state_dir / "loaded.json").read_text())["loaded"]
    assert mount.alive()


def test_a_loaded_subsystem_comes_back_at_remount_with_its_numbering(mount):
    assert control(mount, "load sim.readahead name=sim2 seed=3 tick_seconds=0.02\n") == 0
    sim2 = mount.mountpoint / "sim2"
    assert (sim2 / "info").exists()
    assert write_errno(sim2 / "control", b"prepare_dataset\n") == 0
    before = portions(sim2 / "dataset")
    assert before
    mount.umount()
    mount.start()
    assert json.loads((sim2 / "info").read_text())["source"] == "load"
    assert write_errno(sim2 / "control", b"prepare_dataset\n") == 0
    after = portions(sim2 / "dataset")
    assert after[:len(before)] == before and after[-1] > before[-1]
    # unloaded, it stays gone at the next mount; loaded again, numbering resumes
    assert control(mount, "unload sim2\n") == 0
    mount.umount()
    mount.start()
    assert not sim2.exists()
    assert control(mount, "load sim.readahead name=sim2 seed=3 tick_seconds=0.02\n") == 0
    assert write_errno(sim2 / "control", b"prepare_dataset\n") == 0
    assert portions(sim2 / "dataset")[-1] > after[-1]


def test_sigkill_after_load_then_remount_still_serves_it_and_originals_are_intact(mount, loop):
    original = read_ahead(loop)
    name = f"linux.block.{loop}"
    assert control(mount, block_load(loop)) == 0
    recommend(mount, loop, 2048)
    wait_for(lambda: read_ahead(loop) == "2048", what="the recommendation applied")
    mount.kill(signal.SIGKILL)
    assert read_ahead(loop) == "2048"  # nobody restored it: the daemon is gone
    mount.start()
    assert (mount.mountpoint / name / "info").exists()
    assert control(mount, f"unload {name}\n") == 0
    assert read_ahead(loop) == original


def test_sim_readahead_loads_as_sim2_and_unloads(mount):
    assert control(mount, "load sim.readahead name=sim2 seed=3\n") == 0
    sim2 = mount.mountpoint / "sim2"
    assert json.loads((sim2 / "info").read_text())["source"] == "load"
    wait_for(lambda: (sim2 / "knobs" / "read_ahead_kb").read_text().strip() != "",
             what="sim2 ticking")
    shown = subprocess.run(mlfs_command("status", str(mount.mountpoint)), cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "sim2  sim.readahead (loaded)" in shown.stdout
    assert "sim.readahead  sim.readahead (configured)" in shown.stdout
    as_json = subprocess.run(mlfs_command("status", "--json", str(mount.mountpoint)),
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    sources = {n: s["source"] for n, s in json.loads(as_json.stdout)["subsystems"].items()}
    assert sources == {"sim.readahead": "config", "sim2": "load"}
    assert control(mount, "unload sim2\n") == 0
    assert "sim2" not in os.listdir(mount.mountpoint)
    assert control(mount, "unload sim2\n") == errno.ENOENT


REFUSED = [
    (b"load\n", errno.EINVAL),
    (b"load nosuch.backend\n", errno.EINVAL),
    (b"load sim.readahead\n", errno.EEXIST),  # its default name is served by the config
    (b"load sim.readahead name=sim.readahead\n", errno.EEXIST),
    (b"load sim.readahead name=events\n", errno.EINVAL),
    (b"load sim.readahead name=loaded.json\n", errno.EINVAL),
    (b"load sim.readahead name=Bad!\n", errno.EINVAL),
    (b"load sim.readahead name=x bogus=1\n", errno.EINVAL),
    (b"load sim.readahead name=x seed=[1\n", errno.EINVAL),
    (b'load sim.readahead name=x seed="three"\n', errno.EINVAL),
    (b"load sim.readahead name=x name=y\n", errno.EINVAL),
    (b"load sim.readahead name=x backend=y\n", errno.EINVAL),
    (b"load sim.readahead name=x state_dir=/tmp\n", errno.EINVAL),
    (b'load linux.block devices=["nosuchdisk0"]\n', errno.EINVAL),
    (b"load linux.sysfs name=decl\n", errno.EINVAL),  # nothing declared
    (b"unload\n", errno.EINVAL),
    (b"unload a b\n", errno.EINVAL),
    (b"unload nosuch\n", errno.ENOENT),
    (b"load \xff\xfe\n", errno.EINVAL),
]


def test_malformed_or_unknown_loads_get_their_errno_a_reason_and_change_nothing(mount):
    listing = sorted(os.listdir(mount.mountpoint))
    for command, expected in REFUSED:
        before = len(errors(mount))
        assert control(mount, command) == expected, command
        assert len(errors(mount)) == before + 1, command
    assert sorted(os.listdir(mount.mountpoint)) == listing
    assert not (mount.state_dir / "loaded.json").exists()
    log = (mount.state_dir / "mlfs.log").read_text()
    assert "control refused" in log
    assert mount.alive()


def test_nobody_can_neither_load_nor_unload_nor_mkdir(mount, loop):
    listing = sorted(os.listdir(mount.mountpoint))
    for script in (f"echo 'load sim.readahead name=sim3' > {mount.mountpoint}/control",
                   f"echo 'unload sim.readahead' > {mount.mountpoint}/control",
                   f"mkdir {mount.mountpoint}/linux.block.{loop}",
                   f"rmdir {mount.mountpoint}/sim.readahead"):
        done = as_nobody(script)
        assert done.returncode != 0, script
        assert "Permission denied" in done.stderr, (script, done.stderr)
    assert sorted(os.listdir(mount.mountpoint)) == listing


GROUP_CONFIG = FAST_CONFIG.replace("[mount]\n", '[mount]\ngroup = "nogroup"\n')
DECLARED = ('load linux.sysfs name=decl '
            'knobs={swappiness={path="/proc/sys/vm/swappiness",range=[0,200]}} '
            'features={free={path="/proc/meminfo",key="MemFree"}}\n')


def as_nobody(script: str) -> subprocess.CompletedProcess:
    return sh(f"{NOBODY} bash -c {shlex.quote(script)}")


def test_the_group_loads_but_only_root_loads_a_declared_subsystem(mount_root):
    m = Mount(mount_root, GROUP_CONFIG).start()  # nobody with gid nogroup: the group
    try:
        done = as_nobody(f"echo {shlex.quote(DECLARED.strip())} > {m.mountpoint}/control")
        assert done.returncode != 0 and "Operation not permitted" in done.stderr, done.stderr
        assert "only root may load" in errors(m)[-1]
        assert not (m.mountpoint / "decl").exists()
        done = as_nobody(f"echo 'load sim.readahead name=simg' > {m.mountpoint}/control")
        assert done.returncode == 0, done.stderr
        assert (m.mountpoint / "simg" / "info").exists()
        assert control(m, DECLARED) == 0  # root may
        assert (m.mountpoint / "decl" / "knobs" / "swappiness").exists()
        assert control(m, "unload decl\n") == 0
    finally:
        m.kill(signal.SIGTERM)


def test_unloading_needs_the_right_that_loading_needed(mount_root):
    """Red team A4: the group unloaded root's configured subsystems (and root-only ones).
    Unloading is symmetric with loading: configured subsystems and those only root may
    load are root's to unload (by `unload` or `rmdir`); what the group loads it unloads."""
    m = Mount(mount_root, GROUP_CONFIG).start()  # nobody with gid nogroup: the group
    try:
        assert control(m, DECLARED) == 0  # root loads a root-only backend
        for script in (f"echo 'unload sim.readahead' > {m.mountpoint}/control",
                       f"rmdir {m.mountpoint}/sim.readahead",
                       f"echo 'unload decl' > {m.mountpoint}/control",
                       f"rmdir {m.mountpoint}/decl"):
            done = as_nobody(script)
            assert done.returncode != 0 and "Operation not permitted" in done.stderr, (
                script, done.stderr)
            assert "only root unloads it" in errors(m)[-1]
        assert (m.mountpoint / "sim.readahead" / "info").exists()
        assert (m.mountpoint / "decl" / "info").exists()
        assert as_nobody(f"echo 'load sim.readahead name=simg' > {m.mountpoint}/control"
                         ).returncode == 0
        done = as_nobody(f"echo 'unload simg' > {m.mountpoint}/control")
        assert done.returncode == 0, done.stderr  # its own load: its own unload
        assert not (m.mountpoint / "simg").exists()
        assert control(m, "unload decl\n") == 0
        assert control(m, "unload sim.readahead\n") == 0  # root may
    finally:
        m.kill(signal.SIGTERM)


ACTION_CONFIG = """
[mount]
allow_other = true
group = "nogroup"

[[subsystem]]
backend = "sim.disks"
name = "disks"
drives = 5
seed = 1
tick_seconds = 0.2
action = ["{script}", "--notify"]
action_every_seconds = 3600
"""


def test_a_name_loaded_again_inherits_neither_roots_action_nor_roots_pin(mount_root, tmp_path):
    """Red team A3: after root's configured `disks` was unloaded, a group member loaded its
    own `sim.disks name=disks`; root's action (bound to the name) ran for the member's
    entities and root's `recommendation` pin on model p carried over.  Both belong to the
    configured instance and die with it."""
    seen = tmp_path / "seen"
    script = tmp_path / "act"
    script.write_text(f'#!/bin/sh\necho "$@" >> {seen}\n')
    script.chmod(0o755)
    m = Mount(mount_root, ACTION_CONFIG.format(script=script)).start()
    try:
        model = m.mountpoint / "disks" / "models" / "p"
        assert sh(f"mkdir {model} && echo start > {model}/control && "
                  f"echo recommendation > {model}/mode").returncode == 0
        assert control(m, "unload disks\n") == 0
        load = "load sim.disks name=disks drives=5 seed=7 tick_seconds=0.2"
        done = as_nobody(f"echo {shlex.quote(load)} > {m.mountpoint}/control")
        assert done.returncode == 0, done.stderr
        # the old instance's directory may stay in the kernel's dentry cache for its
        # entry timeout (about a second): wait for the new one's model to show
        wait_for(lambda: (model / "mode").exists(), what="model p on the loaded instance")
        assert (model / "mode").read_text() != "recommendation\n", "root's pin carried over"
        assert as_nobody(f"echo start > {model}/control").returncode == 0
        assert sh(f"echo recommendation > {model}/mode").returncode == 0  # root, again
        assert write_errno(model / "recommend", b"drive_id=1 target=failure p=1\n") == 0
        wait_for(lambda: "source=model" in (model / "alerts").read_text(), timeout=60,
                 what="the model's own alert on the new instance")
        log = (m.state_dir / "mlfs.log").read_text()
        assert "action started" not in log, "root's action ran for the group's instance"
        assert "mlfs_actions_total" not in (m.mountpoint / "metrics").read_text()
        assert not seen.exists()
    finally:
        m.kill(signal.SIGTERM)


def test_mkdir_loads_a_block_device_and_rmdir_unloads_it(mount, loop):
    name = f"linux.block.{loop}"
    (mount.mountpoint / name).mkdir()
    info = json.loads((mount.mountpoint / name / "info").read_text())
    assert info["backend"] == "linux.block" and info["source"] == "load"
    with pytest.raises(FileExistsError):
        (mount.mountpoint / name).mkdir()
    with pytest.raises(OSError) as missing:
        (mount.mountpoint / "linux.block.nosuchdisk0").mkdir()
    assert missing.value.errno == errno.EINVAL
    with pytest.raises(PermissionError):
        (mount.mountpoint / "whatever").mkdir()
    assert "no backend serves 'whatever'" in errors(mount)[-1]
    (mount.mountpoint / name).rmdir()
    assert name not in os.listdir(mount.mountpoint)
    mount.sub.rmdir()  # a configured one: gone until the next mount
    assert "sim.readahead" not in os.listdir(mount.mountpoint)
    mount.umount()
    mount.start()
    assert name not in os.listdir(mount.mountpoint)
    assert "sim.readahead" in os.listdir(mount.mountpoint)


def test_unload_ends_a_blocked_events_reader_of_that_subsystem(mount):
    assert control(mount, "load sim.readahead name=sim2 seed=3 tick_seconds=0.02\n") == 0
    reader = subprocess.Popen(["cat", str(mount.mountpoint / "sim2" / "events")],
                              stdout=subprocess.PIPE)
    writer = os.open(mount.mountpoint / "sim2" / "objective", os.O_WRONLY)
    try:
        wait_blocked(mount, 1)
        assert reader.poll() is None
        assert control(mount, "unload sim2\n") == 0
        out, _ = reader.communicate(timeout=30)  # a reader left blocked never ends
        assert reader.returncode == 0
        last = json.loads(out.decode().splitlines()[-1])
        assert (last["event"], last["action"]) == ("subsystem", "unloaded")
        with pytest.raises(OSError) as gone:  # opened before: gone, as in sysfs
            os.write(writer, b"1.0\n")
        assert gone.value.errno == errno.ENODEV
        wait_for(lambda: not (mount.mountpoint / "sim2").exists(), timeout=3,
                 what="ENOENT once the cached entry expired")
    finally:
        os.close(writer)
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert mount.alive()


WORDS = st.sampled_from(["load", "unload", "sim.readahead", "linux.block", "linux.sysfs",
                         "nosuch", "name=fz", "name=events", "name=sim.readahead", "seed=1",
                         "seed=x", "tick_seconds=0.5", "noise=2", "phases=[\"a\"]",
                         "devices=auto", "apply={}", "=", "name=", "[", "{a=1}", "fz"])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.one_of(WORDS, st.text(min_size=1, max_size=12)), min_size=1,
                      max_size=6))
def test_fuzzed_load_commands_never_crash_and_every_refusal_has_a_reason(shared_mount, words):
    m = shared_mount
    line = " ".join(words).encode("utf-8", "surrogatepass")[:400] + b"\n"
    before = len(errors(m))
    got = control(m, line)
    if got == 0:
        for name in os.listdir(m.mountpoint):  # a load that succeeded: unloaded again
            if name not in {"sim.readahead", "version", "events", "metrics", "control",
                            "errors", "backends"}:
                assert control(m, f"unload {name}\n") == 0
    else:
        assert got in (errno.EINVAL, errno.EEXIST, errno.ENOENT, errno.EPERM), (line, got)
        assert len(errors(m)) == before + 1 or len(errors(m)) == 100, line
    assert m.alive()


def test_a_remembered_load_whose_backend_is_gone_never_blocks_the_mount(mount, loop):
    original = read_ahead(loop)
    name = f"linux.block.{loop}"
    assert control(mount, block_load(loop)) == 0
    recommend(mount, loop, 1024)
    wait_for(lambda: read_ahead(loop) == "1024", what="the recommendation applied")
    mount.kill(signal.SIGKILL)
    remembered = mount.state_dir / "loaded.json"
    data = json.loads(remembered.read_text())
    data["loaded"][0]["entry"]["backend"] = "uninstalled.block"  # its package removed
    remembered.write_text(json.dumps(data))
    mount.start()
    assert read_ahead(loop) == original  # the ledger's original, put back at mount
    assert not (mount.mountpoint / name).exists()
    assert (mount.mountpoint / "sim.readahead" / "info").exists()
    assert any(f"remembered load of '{name}'" in line and "not served" in line
               for line in errors(mount))
    assert "not served" in (mount.state_dir / "mlfs.log").read_text()


def test_the_configuration_wins_a_name_clash_and_a_configured_unload_lasts_one_mount(mount):
    assert control(mount, "load sim.readahead name=simc seed=5\n") == 0
    mount.umount()
    mount.config_path.write_text(FAST_CONFIG + '\n[[subsystem]]\nbackend = "sim.readahead"\n'
                                 'name = "simc"\nseed = 7\ntick_seconds = 0.02\n')
    mount.start()
    simc = mount.mountpoint / "simc"
    assert json.loads((simc / "info").read_text())["source"] == "config"
    assert any("remembered load of 'simc' skipped" in line for line in errors(mount))
    assert control(mount, "unload simc\n") == 0
    assert "simc" not in os.listdir(mount.mountpoint)
    mount.umount()
    mount.start()
    assert json.loads((simc / "info").read_text())["source"] == "config"


def test_a_full_state_dir_refuses_load_and_unload_with_enospc_and_changes_nothing(mount_root):
    with tmpfs(mount_root / "mnt-state", "2m") as state:
        m = Mount(mount_root).start()
        try:
            assert control(m, "load sim.readahead name=sim2 seed=3\n") == 0
            remembered = (m.state_dir / "loaded.json").read_text()
            filler = fill(state)
            try:
                assert control(m, "load sim.readahead name=sim3 seed=4\n") == errno.ENOSPC
                assert "cannot be remembered" in errors(m)[-1]
                assert control(m, "unload sim2\n") == errno.ENOSPC
                assert "not unloaded" in errors(m)[-1]
                served = sorted(n for n in os.listdir(m.mountpoint) if n.startswith("sim"))
                assert served == ["sim.readahead", "sim2"]
                assert (m.state_dir / "loaded.json").read_text() == remembered
            finally:
                filler.unlink()
            first = ticks(m, "sim2")
            wait_for(lambda: ticks(m, "sim2") > first + 5, what="sim2 ticking again")
            assert control(m, "unload sim2\n") == 0
            assert m.alive()
        finally:
            m.kill(signal.SIGTERM)


def test_a_declared_file_that_would_block_is_refused_at_load(mount):
    """/proc/kmsg answers EAGAIN (O_NONBLOCK) where a blocking read would wait for the
    kernel's next word for good: refused before anything is built, the switch free."""
    assert control(mount, 'load linux.sysfs name=k features={k={path="/proc/kmsg"}}') \
        == errno.EINVAL
    assert "would block" in errors(mount)[-1]
    assert not (mount.mountpoint / "k").exists()
    assert control(mount, "emergency") == 0 and control(mount, "auto") == 0


@pytest.mark.parametrize("name", ["emergency_pinned", "quarantine.damaged", "sim.tmp",
                                  "ledger", "host"])
def test_a_name_the_state_directory_or_the_root_uses_is_refused_everywhere(mount, name):
    errors = mount.mountpoint / "errors"
    assert control(mount, f"load sim.readahead name={name}") == errno.EINVAL
    assert "is reserved" in errors.read_text().splitlines()[-1]
    assert name in ("ledger", "host") or not (mount.state_dir / name).exists()
    assert sh(f"mkdir {mount.mountpoint / name}").returncode != 0
    # the emergency pin still works and is released (the name did not take its file)
    assert control(mount, "emergency") == 0 and control(mount, "auto") == 0


def test_the_reserved_table_names_every_owners_entry():
    from mlfs.backends.linux.ledger import LEDGER_DIR

    from mlfs.base import statedir
    from mlfs.base.hostid import HOST_FILE
    from mlfs.base.shipped import FLEET_DIR

    owners = {statedir.FORMAT_FILE, statedir.LOADED_FILE, statedir.PID_FILE,
              statedir.EMERGENCY_PIN_FILE, HOST_FILE, FLEET_DIR, LEDGER_DIR}
    assert owners <= statedir.STATE_ENTRIES <= statedir.RESERVED
    assert statedir.subsystem_name_problem("loaded.json.damaged") is not None


def test_the_group_cannot_write_the_kernel_release_roots_pin_or_skip_the_gate(mount_root):
    m = Mount(mount_root, GROUP_CONFIG).start()  # nobody with gid nogroup: the group
    try:
        applying = "load linux.vm name=vmx apply={vfs_cache_pressure=[100,101]}"
        done = as_nobody(f"echo {shlex.quote(applying)} > {m.mountpoint}/control")
        assert done.returncode != 0 and "Operation not permitted" in done.stderr
        assert "write kernel settings or start root's programs" in errors(m)[-1]
        assert not (m.mountpoint / "vmx").exists()
        observing = "load linux.vm name=vmo"
        assert as_nobody(f"echo {shlex.quote(observing)} > {m.mountpoint}/control"
                         ).returncode == 0
        assert (m.mountpoint / "vmo" / "info").exists()
        model = m.sub / "models" / "g"
        assert as_nobody(f"mkdir {model} && echo start > {model}/control").returncode == 0
        done = as_nobody(f"echo recommendation > {model}/mode")
        assert done.returncode != 0 and "Operation not permitted" in done.stderr
        assert "pinning recommendation" in (model / "errors").read_text().splitlines()[-1]
        assert as_nobody(f"echo collaboration > {model}/mode").returncode == 0
        assert (model / "mode").read_text() == "collaboration\n"
        assert control(m, "emergency") == 0  # root pulls the switch
        done = as_nobody(f"echo auto > {m.mountpoint}/control")
        assert done.returncode != 0 and "Operation not permitted" in done.stderr
        assert (model / "mode").read_text() == "emergency\n"
        assert control(m, "auto") == 0  # root releases it
        assert as_nobody(f"echo emergency > {m.mountpoint}/control").returncode == 0
        assert as_nobody(f"echo auto > {m.mountpoint}/control").returncode == 0  # its own
        assert control(m, "unload vmo\n") == 0
    finally:
        m.kill(signal.SIGTERM)


def test_loads_beyond_max_subsystems_get_enospc_and_change_nothing(mount_root):
    m = Mount(mount_root, FAST_CONFIG.replace("[mount]\n", "[mount]\nmax_subsystems = 2\n"))
    m.start()
    try:
        assert control(m, "load sim.readahead name=second") == 0
        assert control(m, "load sim.readahead name=third") == errno.ENOSPC
        assert "mount.max_subsystems = 2" in errors(m)[-1]
        assert not (m.mountpoint / "third").exists()
    finally:
        m.kill(signal.SIGTERM)


def test_a_huge_seed_or_an_unresolvable_declared_path_is_einval_with_a_reason(mount):
    assert control(mount, "load sim.readahead name=big seed=" + "9" * 3000) == errno.EINVAL
    assert "bit number is outside" in errors(mount)[-1]
    declared = ('load linux.sysfs name=pw knobs={x={path="/proc/1/cwd/etc/passwd",'
                'range=[0,1]}} features={f={path="/proc/loadavg",field=0}}')
    assert control(mount, declared) == errno.EINVAL
    last = errors(mount)[-1]
    assert "passwd" in last and ("cannot be resolved" in last or "outside" in last), last
    assert not (mount.mountpoint / "big").exists() and not (mount.mountpoint / "pw").exists()


def test_a_damaged_loaded_json_is_set_aside_and_the_mount_comes_up(mount_root):
    for damage in ("[" * 100_000, json.dumps({"loaded": [{"name": "version", "entry": {
            "backend": "sim.readahead", "name": "version"}}]})):
        m = Mount(mount_root)
        m.state_dir.mkdir(exist_ok=True)
        (m.state_dir / "loaded.json").write_text(damage)
        m.start()
        try:
            assert (m.sub / "info").exists()
            assert not (m.mountpoint / "version").is_dir()
            if damage.startswith("["):
                assert (m.state_dir / "loaded.json.damaged").exists()
            else:
                assert "is reserved" in errors(m)[-1]
        finally:
            m.kill(signal.SIGTERM)
            shutil.rmtree(m.state_dir, ignore_errors=True)


def test_the_group_cannot_start_roots_bpf_loader_through_linux_block(mount_root, loop):
    """`tracepoints` makes the daemon run its BPF loader as root (red team B4): a load
    that sets it is root's; the same device without it is the group's to observe."""
    m = Mount(mount_root, GROUP_CONFIG).start()
    try:
        for value in ("true", '"auto"'):
            tracing = f"load linux.block devices=[\"{loop}\"] tracepoints={value}"
            done = as_nobody(f"echo {shlex.quote(tracing)} > {m.mountpoint}/control")
            assert done.returncode != 0 and "Operation not permitted" in done.stderr, value
            assert "start root's programs" in errors(m)[-1]
            assert not (m.mountpoint / f"linux.block.{loop}").exists()
        observing = f"load linux.block devices=[\"{loop}\"]"
        done = as_nobody(f"echo {shlex.quote(observing)} > {m.mountpoint}/control")
        assert done.returncode == 0, done.stderr
        assert (m.mountpoint / f"linux.block.{loop}" / "info").exists()
    finally:
        m.kill(signal.SIGTERM)
