"""`mlfs train` as a real subprocess survives its mount going away and coming back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.harness import REPO, Mount, wait_for


def _policy(model) -> str:
    try:
        return (model / "policy").read_text()
    except OSError:
        return ""


def test_the_trainer_resumes_after_the_mount_is_killed_and_mounted_again(mount_root):
    m = Mount(mount_root).start()
    model = m.sub / "models" / "lgbm"
    log = open(mount_root / "train.log", "wb")  # noqa: SIM115 - closed in finally
    trainer = subprocess.Popen(
        [sys.executable, "-m", "mlfs", "train", str(m.mountpoint), "sim.readahead",
         "--model", "lgbm", "--max-seconds", "120"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _policy(model), 60, what="a first policy")
        m.kill(signal.SIGKILL)  # the daemon dies; the trainer sees the mount vanish
        assert trainer.poll() is None, "the trainer died with the mount"
        m.start()  # same mountpoint, same state dir
        # the model survived the crash, and the trainer talks to the new daemon:
        # it uploads again (the restored proxy keeps the old policy, so wait for a
        # new recommendation or policy event counted in the journal)
        wait_for(lambda: (model / "state").read_text() in ("started\n", "running\n"), 30,
                 what="the model restarted")
        before = _journal_rows(model)
        wait_for(lambda: _journal_rows(model) > before, 60,
                 what="new trainer input after the restart")
        assert trainer.poll() is None
        assert (model / "errors").read_text() == ""
    finally:
        if trainer.poll() is None:
            os.kill(trainer.pid, signal.SIGTERM)
            trainer.wait(20)
        log.close()
        m.kill(signal.SIGTERM)
    assert trainer.returncode == 0, (mount_root / "train.log").read_text()[-2000:]


def _journal_rows(model) -> int:
    import pyarrow.parquet as pq

    total = 0
    for portion in (model / "recommendations").glob("*.parquet"):
        try:
            total += pq.ParquetFile(portion).metadata.num_rows
        except OSError:
            pass
    return total
