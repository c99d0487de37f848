"""`mount.fuse.mlfs`: the mount(8) helper, so that /etc/fstab can mount mlfs.

For `mount -t fuse.mlfs none /mnt/mlfs -o config=/etc/mlfs/mlfs.toml`, or the
fstab line

    none  /mnt/mlfs  fuse.mlfs  config=/etc/mlfs/mlfs.toml,_netdev  0 0

util-linux mount(8) runs `/sbin/mount.fuse.mlfs none /mnt/mlfs -o rw,config=...`
(the helper convention of mount(8): `SOURCE DIR [-sfnv] [-N NS] [-o OPTS]
[-t TYPE]`).  mount.fuse3's `TYPE#SOURCE` convention reaches this helper too:
`mount.fuse.mlfs#none /mnt/mlfs fuse config=...` makes mount.fuse3 run
`mount.fuse.mlfs none /mnt/mlfs -o ...` from PATH.

The helper translates the options and runs `mlfs mount` with the same
interpreter; that returns once the mount answers, with its exit code.  The
source is ignored (mlfs has no device: write `none` or `mlfs`).

Options:
  config=FILE      the TOML configuration (default: the embedded one)
  state_dir=DIR    the state directory (default: one per mountpoint under
                   /var/lib/mlfs)
Generic mount options (rw, nosuid, nodev, noatime, _netdev, defaults, noauto,
user, nofail, x-systemd.*, ...) are accepted and ignored; `ro` and anything
else is refused (unless `-s`, sloppy, is given: then unknown ones are ignored
with a warning).  `-f` (fake) checks the options and does nothing; `-v` prints
the command it runs; `-n` is ignored.

Exit status as mount(8)'s: 0 mounted, 1 incorrect invocation (a refused
option or flag), 2 system error (mlfs cannot be run), 8 interrupted, 32 mount
failure (the configuration, the mountpoint or the daemon failed).  A
configuration mistake is reported by `mlfs mount` before any daemon starts:
one line on stderr naming the file and the key (passed on), status 32.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

PROG = "mount.fuse.mlfs"

USAGE = f"usage: {PROG} SOURCE MOUNTPOINT [-sfnv] [-o config=FILE,state_dir=DIR,...]"

#: generic VFS / mount(8) / fstab options that mean nothing to mlfs: accepted, ignored
IGNORED = frozenset({
    "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
    "nofail", "_netdev", "netdev",
    "suid", "nosuid", "dev", "nodev", "exec", "noexec",
    "sync", "async", "dirsync", "atime", "noatime", "relatime", "norelatime",
    "strictatime", "nostrictatime", "diratime", "nodiratime", "lazytime", "nolazytime",
    "iversion", "noiversion", "mand", "nomand", "silent", "loud",
})

#: options mount(8), mount.fuse3 or systemd add that carry a value; accepted, ignored
IGNORED_PREFIXES = ("x-", "comment=", "user=", "helper=")

#: options mlfs sets itself, with where to change them instead
HINTS = {
    "ro": "mlfs is read-write by nature (control files, recommend); "
          "give readers no write access instead ([mount] group)",
    "allow_other": "set it in the configuration: [mount] allow_other = true",
    "default_permissions": "mlfs always mounts with default_permissions",
    "auto_unmount": "mlfs always mounts with auto_unmount",
}

#: the options this helper passes on: `name=` -> the `mlfs mount` flag
VALUED = {"config": "--config", "state_dir": "--state-dir"}


#: mount(8)'s exit status (man 8 mount, "RETURN CODES"): fstab, scripts and systemd's
#: mount units read these, so a helper reports in the same terms
EX_SUCCESS = 0
EX_USAGE = 1  # incorrect invocation or permissions
EX_SYSERR = 2  # system error (cannot fork, out of memory, ...)
EX_USER = 8  # user interrupt
EX_FAIL = 32  # mount failure


class UsageError(Exception):
    """A call this helper cannot serve (mount(8) exit status 1)."""


@dataclass
class Request:
    source: str = ""
    mountpoint: str = ""
    values: dict[str, str] = field(default_factory=dict)
    fake: bool = False
    verbose: bool = False
    sloppy: bool = False
    warnings: list[str] = field(default_factory=list)


def parse_args(argv: list[str]) -> Request:
    """The mount(8) helper calling convention, flags before or after the operands."""
    request = Request()
    positional: list[str] = []
    option_strings: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--":
            positional += args
            break
        if arg in ("-h", "--help"):
            raise UsageError(USAGE)
        if arg.startswith("-o") or arg.startswith("-t") or arg.startswith("-N"):
            flag, value = arg[:2], arg[2:]
            if not value:
                if not args:
                    raise UsageError(f"{flag} needs a value")
                value = args.pop(0)
            if flag == "-o":
                option_strings.append(value)
            elif flag == "-t":
                if value not in ("fuse.mlfs", "mlfs", "fuse"):
                    raise UsageError(f"this helper mounts fuse.mlfs, not {value!r}")
            else:
                raise UsageError("mounting in another namespace (-N) is not supported; "
                                 "run mount inside it (nsenter)")
        elif arg.startswith("-") and len(arg) > 1:
            for letter in arg[1:]:
                if letter == "s":
                    request.sloppy = True
                elif letter == "f":
                    request.fake = True
                elif letter == "v":
                    request.verbose = True
                elif letter == "n":
                    pass  # no /etc/mtab to write: the kernel keeps the table
                else:
                    raise UsageError(f"unknown flag -{letter}\n{USAGE}")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise UsageError(USAGE)
    request.source, request.mountpoint = positional
    for text in option_strings:
        for option in text.split(","):
            _take_option(request, option.strip())
    return request


def _take_option(request: Request, option: str) -> None:
    if not option or option in IGNORED or option.startswith(IGNORED_PREFIXES):
        return
    name, eq, value = option.partition("=")
    if name in VALUED and eq:
        if not value:
            raise UsageError(f"option {name}= needs a value")
        request.values[name] = value  # the last one wins, as with mount(8)
        return
    if name in VALUED:
        reason = f"option {name} needs a value ({name}=...)"
    elif name in HINTS:
        reason = f"option {option!r} refused: {HINTS[name]}"
    else:
        known = ", ".join(f"{key}=" for key in VALUED)
        reason = f"unknown option {option!r} (mlfs takes {known} and generic mount options)"
    if request.sloppy and name not in VALUED:
        request.warnings.append(f"{reason}; ignored (-s)")
        return
    raise UsageError(reason)


def mlfs_mount_command(request: Request) -> list[str]:
    """`python -m mlfs mount ...` for the same interpreter, every path absolute."""
    command = [sys.executable, "-m", "mlfs", "mount", os.path.abspath(request.mountpoint)]
    for name, flag in VALUED.items():
        if name in request.values:
            command += [flag, os.path.abspath(os.path.expanduser(request.values[name]))]
    return command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        request = parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EX_USAGE
    for warning in request.warnings:
        print(f"{PROG}: {warning}", file=sys.stderr)
    command = mlfs_mount_command(request)
    if request.verbose or request.fake:
        print(f"{PROG}: {' '.join(command)}", file=sys.stderr)
    if request.fake:
        return EX_SUCCESS
    # cwd "/": the daemon must not keep the caller's directory busy (or import from it)
    # quiet on success, as mount(8) is; `mlfs mount` reports failures on stderr
    try:
        done = subprocess.run(command, cwd="/", stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, text=True)
    except KeyboardInterrupt:
        return EX_USER
    except OSError as exc:  # cannot run the interpreter at all
        print(f"{PROG}: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return EX_SYSERR
    if done.stdout and (request.verbose or done.returncode != 0):
        print(done.stdout, end="", file=sys.stderr)
    return mount_status(done.returncode)


def mount_status(mlfs_status: int) -> int:
    """mount(8)'s status for `mlfs mount`'s: 0 stays 0, every failure is a mount failure.

    `mlfs mount` exits 2 for a configuration or mountpoint it refuses and 1
    when the daemon failed to start; to mount(8) both are "mount failure"
    (32), as a missing mountpoint is for mount(8) itself.  Exit 1 would say
    the helper was called wrongly, which it was not.
    """
    return EX_SUCCESS if mlfs_status == 0 else EX_FAIL


if __name__ == "__main__":
    sys.exit(main())
