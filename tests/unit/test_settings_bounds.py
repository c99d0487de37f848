"""Numbers too large for any range are refused in one line, never a traceback."""

import subprocess
import sys


def test_a_seed_of_four_hundred_digits_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "big.toml"
    config.write_text('[[subsystem]]\nbackend = "sim.readahead"\nseed = 1' + "0" * 400 + "\n")
    done = subprocess.run([sys.executable, "-m", "mlfs", "config", "check", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "seed: a 1329-bit number is outside" in done.stderr
