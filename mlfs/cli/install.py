"""`mlfs install-units`: the systemd units, man pages, completions and the `mlfs` user.

The units in the repository name `/usr/local/bin/mlfs`; a venv install puts the
command elsewhere, and `systemd-analyze verify` then fails.  This writes the units
with the `mlfs` command that runs this (its real path), installs the manual pages
and shell completions, and a sysusers.d file that creates the `mlfs` system user
and group `mlfs-train@` runs as.  With `--root /` (the default) it then runs
`systemd-sysusers` and `systemctl daemon-reload`; under another root (a package
build, an image) it only writes files.  Existing files are replaced; nothing else
is touched.  Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlfs.base.durable import UnsafePath, write_durably

from .common import command

#: the command the repository's units name, replaced by the real one
UNIT_COMMAND = "/usr/local/bin/mlfs"
#: the system user `mlfs-train@` runs as (systemd-sysusers(8) syntax)
SYSUSERS = 'u mlfs - "mlfs trainers" /var/lib/mlfs /usr/sbin/nologin\n'

EXAMPLES = """examples:
  sudo .venv/bin/mlfs install-units                  # units, man pages, completions, user
  mlfs install-units --root /tmp/pkg --prefix /usr   # only write files, for a package"""


def mlfs_command() -> Path:
    """The `mlfs` script beside this interpreter (a venv's bin/), else the one on PATH."""
    beside = Path(sys.executable).parent / "mlfs"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside.absolute()
    found = shutil.which("mlfs")
    if found is None:
        raise FileNotFoundError("no `mlfs` command beside this Python or on PATH")
    return Path(found).absolute()


#: package data directory -> the repository's directory it is installed from (pyproject)
DATA = {"units": "systemd", "man": "man", "completions": "completions"}


def shipped(name: str) -> list[Path]:
    """The files of a data directory: inside an installed package (`mlfs/units/`...), or
    the repository's own (`systemd/`...) when mlfs runs from a checkout."""
    import mlfs

    here = Path(mlfs.__file__).resolve().parent
    directory = (mlfs.SOURCE_TREE / DATA[name] if mlfs.SOURCE_TREE is not None
                 else here / name)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not installed with this mlfs")
    return sorted(p for p in directory.iterdir() if p.is_file())


def plan(root: Path, prefix: Path, mlfs: Path) -> list[tuple[Path, bytes, int]]:
    """(target, content, mode) of every file to write."""
    inside = Path(str(root)) / str(prefix).lstrip("/")
    out = []
    for unit in shipped("units"):
        if unit.suffix == ".service":
            text = unit.read_text().replace(UNIT_COMMAND, str(mlfs))
            out.append((root / "etc/systemd/system" / unit.name, text.encode(), 0o644))
    for page in shipped("man"):
        if page.suffix == ".8":
            out.append((inside / "share/man/man8" / page.name, page.read_bytes(), 0o644))
    completions = {"mlfs.bash": "share/bash-completion/completions/mlfs",
                   "_mlfs": "share/zsh/vendor-completions/_mlfs"}
    for script in shipped("completions"):
        if script.name in completions:
            out.append((inside / completions[script.name], script.read_bytes(), 0o644))
    out.append((inside / "lib/sysusers.d/mlfs.conf", SYSUSERS.encode(), 0o644))
    return out


def install_file(target: Path, content: bytes, mode: int) -> bool:
    """Install one file the safe way (mlfs.base.durable): missing directories made 0755
    whatever the umask, the file written whole with `mode`, a link at its name replaced,
    never written through or chmodded (red-team U2: the target of a planted link was
    overwritten and made 0644).  A unit masked by a link to /dev/null is the operator's
    decision: False, nothing written."""
    if target.is_symlink() and os.readlink(target) == "/dev/null":
        return False
    existing = target.parent
    while not existing.exists():
        existing = existing.parent
    write_durably(target, content, mode=mode, anchor=existing, make_dirs=True,
                  dir_mode=0o755, replace_link=True)
    return True


def cmd_install_units(args: argparse.Namespace) -> int:
    root, prefix = Path(args.root), Path(args.prefix)
    if not root.is_dir() or not prefix.is_absolute():
        print(f"mlfs install-units: {root if not root.is_dir() else prefix}: "
              + ("not a directory" if not root.is_dir() else "the prefix must be absolute"),
              file=sys.stderr)
        return 2
    masked = []
    try:
        mlfs = mlfs_command()
        files = plan(root, prefix, mlfs)
        for target, content, mode in files:
            if install_file(target, content, mode):
                print(f"installed {target}")
            else:
                masked.append(target)
    except UnsafePath as exc:
        print(f"mlfs install-units: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mlfs install-units: {getattr(exc, 'filename', None) or ''}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    for target in masked:
        print(f"mlfs install-units: {target} is masked (a link to /dev/null): left as it is; "
              f"`systemctl unmask {target.name}` and run again to install it", file=sys.stderr)
    if masked:
        return 2
    if root.resolve() == Path("/"):
        sysusers = next(t for t, _, _ in files if t.name == "mlfs.conf")
        for step in (["systemd-sysusers", str(sysusers)], ["systemctl", "daemon-reload"]):
            if shutil.which(step[0]) is None:
                print(f"mlfs install-units: {step[0]} not found: run `{' '.join(step)}` "
                      "on a systemd host", file=sys.stderr)
                continue
            done = subprocess.run(step, capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                print(f"mlfs install-units: {' '.join(step)}: "
                      f"{(done.stderr or done.stdout).strip()[:200]}", file=sys.stderr)
                return 1
    print(f"the units run {mlfs}")
    return 0


def add_parser(sub) -> None:
    p = command(sub, "install-units", "install the systemd units (naming this mlfs), the "
                "manual pages, shell completions and the mlfs system user", EXAMPLES)
    p.add_argument("--root", default="/", metavar="DIR",
                   help="install under this root (default /: also runs systemd-sysusers "
                        "and systemctl daemon-reload)")
    p.add_argument("--prefix", default="/usr/local", metavar="PREFIX",
                   help="where man pages, completions and sysusers.d go under the root "
                        "(default /usr/local; units always go to /etc/systemd/system)")
    p.set_defaults(func=cmd_install_units)
