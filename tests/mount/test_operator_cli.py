"""The `mlfs` verbs an operator runs against a live mount: no quiet failures.

Every test runs the real command in a subprocess against a real mount
(issue 32): a trainer for a subsystem that never appears, `fleet push` on a
mount made with --state-dir, `report` sealing first, `report --png` without
matplotlib.
"""

from __future__ import annotations

import re
import subprocess

from tests.harness import REPO, mlfs_command, write_errno


def run_mlfs(*args: str, timeout: float = 60, prefix: tuple[str, ...] = (),
             env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *mlfs_command(*args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


# ---- mlfs fleet push: the state directory of a mount made with --state-dir -------------------
def test_fleet_push_finds_the_state_dir_of_a_mount_made_with_state_dir(mount, tmp_path):
    assert write_errno(mount.sub / "control", b"prepare_dataset\n") == 0
    store = tmp_path / "store"
    done = run_mlfs("fleet", "push", str(mount.mountpoint), "--store", str(store), "--once")
    assert done.returncode == 0, done.stderr
    assert re.search(r"[1-9]\d* portions \(\d+ rows\) shipped", done.stdout), done.stdout
    assert list((mount.state_dir / "fleet").glob("push-*.json")), "the cursor is in its state"


