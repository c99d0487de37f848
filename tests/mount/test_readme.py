"""README's "A first look" runs as written (paths moved under a temporary directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.harness import REPO


def first_look() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## A first look", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"\n\n((?:    .*\n)+)", section).group(1)
    return [line[4:] for line in block.splitlines()]


def test_readme_first_look_works_as_written(mount_root):
    lines = first_look()
    assert lines[0] == "mkdir -p /mnt/mlfs" and lines[-2].startswith("mlfs umount")
    mountpoint, state = mount_root / "mnt", mount_root / "state"
    script = []
    for line in lines:
        line = line.replace("mlfs mount /mnt/mlfs", f"mlfs mount /mnt/mlfs --state-dir {state}")
        line = line.replace("/var/lib/mlfs/mnt_mlfs-*/", str(state))
        line = line.replace("/mnt/mlfs", str(mountpoint))
        line = line.replace("--max-seconds 60", "--max-seconds 5")
        line = re.sub(r"^mlfs ", f"{sys.executable} -m mlfs ", line)
        line = re.sub(r"^python ", f"{sys.executable} ", line)
        script.append(line)
    script.append("wait")  # the trainer started with & (it ends after --max-seconds)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                          timeout=240, cwd=mount_root, env=env)
    try:
        out, err = done.stdout, done.stderr
        assert "mounted (pid" in out, err
        assert '"objective"' in out and '"knobs"' in out  # cat info
        assert "Invalid argument" in err  # the refused recommendation, as the README says
        assert "read_ahead_kb" in out  # the errors file names it
        assert "objective_count" in out and "objective_mean" in out, err
        assert "sim.readahead" in out and "mine" in out  # mlfs status
        assert re.search(r"mlfs: wrote \S+\.html", out), err
        assert done.returncode == 0, err
        assert not os.path.ismount(mountpoint)
    finally:
        if os.path.ismount(mountpoint):
            subprocess.run([sys.executable, "-m", "mlfs", "umount", str(mountpoint)],
                           capture_output=True, timeout=90, cwd=REPO)
