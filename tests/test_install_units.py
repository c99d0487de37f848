"""`mlfs install-units` into a scratch root: the units name this venv's `mlfs` and pass
the real `systemd-analyze verify`, the sysusers.d file makes the `mlfs` user with the
real `systemd-sysusers`, and the man pages and completions land where man and the
shells look (issue 32 item 7)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MLFS = Path(sys.executable).parent / "mlfs"


def install(root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MLFS), "install-units", "--root", str(root), *extra],
                          capture_output=True, text=True, timeout=60)


def test_installed_units_name_this_mlfs_and_pass_systemd_analyze_verify(tmp_path):
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    units = tmp_path / "etc/systemd/system"
    names = sorted(p.name for p in units.glob("*.service"))
    assert names == ["mlfs-fleet-push@.service", "mlfs-train@.service", "mlfs@.service"]
    for unit in units.glob("*.service"):
        text = unit.read_text()
        assert "/usr/local/bin/mlfs" not in text
        assert f"ExecStart={MLFS.absolute()} " in text
    assert (tmp_path / "usr/local/share/man/man8/mlfs.8").read_text().startswith(".TH")
    assert "install-units" in (tmp_path / "usr/local/share/bash-completion/completions"
                               / "mlfs").read_text()
    assert (tmp_path / "usr/local/share/zsh/vendor-completions/_mlfs").is_file()
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no",
         str(units / "mlfs@mnt-mlfs.service"), str(units / "mlfs-train@sim.readahead.service"),
         str(units / "mlfs-fleet-push@mnt-mlfs.service")],
        capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and not verify.stdout and not verify.stderr, (
        verify.stdout + verify.stderr)


def test_the_sysusers_file_makes_the_mlfs_user_the_trainer_unit_runs_as(tmp_path):
    assert install(tmp_path, "--prefix", "/usr").returncode == 0
    conf = tmp_path / "usr/lib/sysusers.d/mlfs.conf"
    assert conf.is_file()
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not installed (Debian package systemd)")
    (tmp_path / "etc").mkdir(exist_ok=True)
    done = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    passwd = (tmp_path / "etc/passwd").read_text().splitlines()
    (user,) = [line for line in passwd if line.startswith("mlfs:")]
    assert user.endswith(":/var/lib/mlfs:/usr/sbin/nologin")
    train = (tmp_path / "etc/systemd/system/mlfs-train@.service").read_text()
    assert "User=mlfs" in train and "Group=mlfs" in train
    assert any(line.startswith("mlfs:") for line in
               (tmp_path / "etc/group").read_text().splitlines())


@pytest.mark.parametrize("args, said", [
    (["--root", "/nonexistent-root"], "not a directory"),
    (["--prefix", "relative"], "the prefix must be absolute"),
])
def test_a_bad_root_or_prefix_is_one_line_and_exit_2(tmp_path, args, said):
    done = subprocess.run([str(MLFS), "install-units", *(
        a if a != "relative" else "relative" for a in args)] + (
        ["--root", str(tmp_path)] if "--root" not in args else []),
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "etc").exists()


def test_a_link_at_a_unit_path_is_replaced_and_its_target_never_touched(tmp_path):
    """Red-team U2: the link's target was overwritten with the unit and chmodded 0644."""
    precious = tmp_path / "precious"
    precious.write_text("root's secret\n")
    precious.chmod(0o600)
    units = tmp_path / "root/etc/systemd/system"
    units.mkdir(parents=True)
    (units / "mlfs@.service").symlink_to(precious)
    done = install(tmp_path / "root")
    assert done.returncode == 0, done.stderr
    assert precious.read_text() == "root's secret\n"
    assert oct(precious.stat().st_mode)[-3:] == "600"
    assert not (units / "mlfs@.service").is_symlink()
    assert "ExecStart=" in (units / "mlfs@.service").read_text()


def test_a_masked_unit_stays_masked_said_in_one_line_and_exit_2(tmp_path):
    """Run in a mount namespace with a scratch file bound over /dev/null, so an installer
    that wrote through the mask (main did: it made the machine's /dev/null 0644) harms
    only the scratch file."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to stand in for /dev/null")
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / "mlfs-train@.service").symlink_to("/dev/null")
    stand_in = tmp_path / "null"
    stand_in.write_bytes(b"")
    stand_in.chmod(0o666)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind "$0" /dev/null && exec "$1" install-units --root "$2"',
         str(stand_in), str(MLFS), str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    if "mount" in done.stderr and "permission denied" in done.stderr.lower():
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "masked" in done.stderr
    assert (units / "mlfs-train@.service").readlink() == Path("/dev/null")
    assert stand_in.read_bytes() == b"" and oct(stand_in.stat().st_mode)[-3:] == "666"
    assert "ExecStart=" in (units / "mlfs@.service").read_text()  # the others installed


def test_directories_are_0755_whatever_the_umask(tmp_path):
    done = subprocess.run(["sh", "-c", f"umask 0; exec {MLFS} install-units --root {tmp_path}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for path in [tmp_path / "etc", tmp_path / "etc/systemd/system",
                 tmp_path / "usr/local/share/man/man8"]:
        assert oct(path.stat().st_mode)[-3:] == "755", path
    assert oct((tmp_path / "etc/systemd/system/mlfs@.service").stat().st_mode)[-3:] == "644"
