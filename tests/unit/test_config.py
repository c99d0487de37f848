"""Configuration mistakes: one line naming the file and the key, exit 2, nothing started.

Every case runs the real `mlfs mount` command: the check must happen before
the daemon forks, so no state directory appears and no process is left.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlfs.config import ConfigError, check_host, load_config, parse_config

REPO = Path(__file__).resolve().parent.parent.parent

SIM = '[[subsystem]]\nbackend = "sim.readahead"\n'
SIM2 = SIM + 'name = "sim2"\n'

#: (configuration text, what the one stderr line must say after "FILE: ")
MISTAKES = [
    (SIM + "\n" + SIM2 + "tick_seconds = nan\n",
     "subsystem #2 (sim2): tick_seconds: nan is not a finite number"),
    (SIM2 + "tick_seconds = inf\n", "subsystem #1 (sim2): tick_seconds: inf is not a finite"),
    (SIM2 + "tick_seconds = 0\n", "subsystem #1 (sim2): tick_seconds: 0 is outside 0.001..3600"),
    (SIM2 + "tick_seconds = -1\n", "subsystem #1 (sim2): tick_seconds: -1 is outside"),
    (SIM2 + 'tick_seconds = "fast"\n', "tick_seconds: 'fast' is not a number"),
    (SIM + 'name = "../../../escape"\n',
     "subsystem #1 (../../../escape): name: '../../../escape' is not a subsystem name"),
    (SIM + 'name = "Upper"\n', "name: 'Upper' is not a subsystem name"),
    (SIM + 'name = "events"\n', "name: 'events' is reserved"),
    (SIM + 'name = "ledger"\n', "name: 'ledger' is reserved"),
    (SIM + "\n" + SIM, "subsystem #2 (sim.readahead): name: 'sim.readahead' is already "
     "the name of subsystem #1"),
    (SIM2 + "colour = 3\n", "subsystem #1 (sim2): colour: unknown setting"),
    (SIM2 + 'state_dir = "/tmp"\n', "state_dir: set by mlfs"),
    ('[[subsystem]]\nbackend = "sim.nothing"\n',
     "subsystem #1 (sim.nothing): backend: unknown backend 'sim.nothing'"),
    ("[[subsystem]]\nname = \"x\"\n", "subsystem #1 (x): backend: missing"),
    (SIM2 + "phase_ticks = [10, 5]\n", "phase_ticks: [10, 5] is not [min, max]"),
    (SIM2 + "noise = -0.5\n", "noise: -0.5 is outside 0.0..1.0"),
    (SIM2 + 'phases = ["sequential", "zigzag"]\n', "phases: item 2: 'zigzag' is not one of"),
    ('[[subsystem]]\nbackend = "linux.vm"\ntick_seconds = 1.0\nmeasure_seconds = 2.0\n',
     "subsystem #1 (linux.vm): measure_seconds: 2 is longer than the tick"),
    ('[[subsystem]]\nbackend = "linux.vm"\napply = {swappiness = [0, 999]}\n',
     "subsystem #1 (linux.vm): apply.swappiness = [0, 999] must satisfy"),
    ('[[subsystem]]\nbackend = "linux.block"\ndevices = ["nosuchdisk"]\n',
     "subsystem #1 (linux.block): devices: 'nosuchdisk' is not a whole disk"),
    ('[[subsystem]]\nbackend = "linux.block"\ntracepoints = "maybe"\n',
     "tracepoints: 'maybe' is not true, false or 'auto'"),
    ("[mount]\nmax_tasks = 0\n", "mount.max_tasks: 0 is outside 64..65536"),
    ("[mount]\nmetrics_port = 70000\n", "mount.metrics_port: 70000 is outside 0..65535"),
    ("[store]\nseal_seconds = nan\n", "store.seal_seconds: nan is not a finite number"),
    ("[store]\nseal_rows = 0\n", "store.seal_rows: 0 is outside 1..10000000"),
    ("[store]\nretention_count = -1\n", "store.retention_count: -1 is outside"),
    ("[modes]\nlearning_share = 1.5\n", "modes.learning_share: 1.5 is outside 0.0..1.0"),
    ("[modes]\nsilence_seconds = -inf\n", "modes.silence_seconds: -inf is not a finite"),
    ("[modes]\nwindow_ticks = 0\n", "modes.window_ticks: 0 is outside 1..10000000"),
    ("[modes]\nwindow_ticks = 1.5\n", "modes.window_ticks: expected int"),
    ("[modes]\nbogus = 1\n", "modes.bogus: unknown setting (known: learning_share, "),
    ("[mount]\ngroup = \"no-such-group-here\"\n", "mount.group: no group"),
    ("[mount\n", "not valid TOML: "),
    ("[extra]\n", "unknown section(s) extra"),
]


def _mount(config: Path, state: Path, mountpoint: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlfs", "mount", str(mountpoint),
                           "--config", str(config), "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize(("text", "says"), MISTAKES, ids=[m[1][:40] for m in MISTAKES])
def test_a_configuration_mistake_is_one_line_naming_file_and_key(text, says):
    with pytest.raises(ConfigError) as caught:
        check_host(parse_config(text, "/etc/mlfs.toml"))
    line = str(caught.value)
    assert line.startswith("/etc/mlfs.toml: ") and says in line, line
    assert "\n" not in line


#: the attacks of issue 10 and one of each kind, through the real command
CLI_CASES = [MISTAKES[0], MISTAKES[5], MISTAKES[12], MISTAKES[23], MISTAKES[-3],
             MISTAKES[-2]]


@pytest.mark.parametrize(("text", "says"), CLI_CASES, ids=[m[1][:40] for m in CLI_CASES])
def test_mount_refuses_a_mistake_with_exit_2_before_forking(tmp_path, text, says):
    config = tmp_path / "mlfs.toml"
    config.write_text(text)
    (tmp_path / "mnt").mkdir()
    done = _mount(config, tmp_path / "state", tmp_path / "mnt")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"mlfs: {config}: ") and says in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()  # no daemon was forked: it makes the dir
    assert done.stdout == ""


def test_an_unreadable_configuration_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=f"^{tmp_path}/none.toml: cannot read: No such file"):
        load_config(tmp_path / "none.toml")


def test_the_embedded_default_and_the_shipped_configurations_pass(tmp_path):
    assert parse_config("", "t").subsystems == ()
    assert load_config(None).subsystems
    for path in (REPO / "docker" / "mlfs.toml",):
        assert load_config(path).subsystems  # its group exists in the image, not here


def test_integers_are_accepted_where_a_float_is_expected():
    config = parse_config(SIM2 + "tick_seconds = 1\nnoise = 0\n[store]\nseal_seconds = 2\n",
                          "t")
    assert config.store.seal_seconds == 2.0
    from mlfs.backends import create_subsystems

    [sim] = create_subsystems(config.subsystems)
    assert sim.tick_seconds == 1.0 and sim.noise == 0.0


#: (configuration text, the one line after "FILE: "): where the value is, and the nearest name
LOCATED = [
    ("[mount]\nallow_other = true\n\n  max_tasks = 0  # too few\n",
     "mount.max_tasks: 0 is outside 64..65536 (at line 4)"),
    ("# a comment\n[store]\nseal_row = 100\n",
     "store.seal_row: unknown setting (did you mean seal_rows?) (at line 3)"),
    ("[modes]\nwindow_tick = 10\n",
     "modes.window_tick: unknown setting (did you mean window_ticks?) (at line 2)"),
    ("[mount]\nseal_rows = 100\n", "mount.seal_rows: unknown setting (a [store] setting) "
     "(at line 2)"),
    ("[stores]\nseal_rows = 1\n", "unknown section(s) stores (did you mean store?) (at line 1)"),
    ("store.seal_seconds = -1.0\n", "store.seal_seconds: -1.0 is outside 0.1..31536000 "
     "(at line 1)"),
    ("[mount]\nhandles_per_uid = 5\nhandles = 2\n", "mount.handles_per_uid, handles: need "
     "1 <= 5 <= 2 <= 1000000 (at line 2)"),
    (SIM + "\n" + SIM2 + "seed = 1\nnoise = -0.5\n",
     "subsystem #2 (sim2): noise: -0.5 is outside 0.0..1.0 (at line 8)"),
    (SIM + "\n" + SIM2 + "tick_second = 1.0\n",
     "subsystem #2 (sim2): tick_second: unknown setting (did you mean tick_seconds?) "
     "(at line 7)"),
]


@pytest.mark.parametrize(("text", "says"), LOCATED, ids=[m[1][:40] for m in LOCATED])
def test_a_value_error_names_its_line_and_a_misspelled_key_the_nearest_one(text, says):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "/etc/mlfs.toml")
    assert str(caught.value).startswith(f"/etc/mlfs.toml: {says}"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_subsystem_mistake_without_a_key_names_the_line_of_its_table():
    with pytest.raises(ConfigError) as caught:
        parse_config(SIM + "\n" + '[[subsystem]]\nname = "x"\n', "t")
    assert caught.value.line == 4 and str(caught.value).endswith("(at line 4)")


@pytest.mark.parametrize("max_tasks", [63, 65537, 100_000])
def test_max_tasks_has_one_range_for_the_file_and_for_mount_config(max_tasks):
    from mlfs.config import RANGES, MountConfig

    assert RANGES["mount.max_tasks"] == (64, 65536)
    with pytest.raises(ConfigError, match="outside 64..65536"):
        parse_config(f"[mount]\nmax_tasks = {max_tasks}\n", "t")
    with pytest.raises(ValueError, match="outside 64..65536"):
        MountConfig(max_tasks=max_tasks, events_blocked_reads=16)
    assert MountConfig(max_tasks=65536).max_tasks == 65536
