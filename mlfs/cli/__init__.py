"""The `mlfs` command line: one module per command, each with its one parser.

Each command module (`mlfs.cli.mount`, ...) defines `EXAMPLES` (its --help
epilog and its part of the man page's EXAMPLES), `add_parser(sub)` and the
function the parser dispatches to; what a command runs (the daemon, the
status view, the report, the trainer, the bench) lives outside this package
and is imported only when that command runs, so `mlfs --help` stays fast.
Nothing outside the command line imports this package: it is the top layer.
`entry` is the console script (pyproject: `mlfs = "mlfs.cli:entry"`).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import (
    backends,
    bench,
    config,
    demo,
    fleet,
    install,
    mount,
    report,
    reports,
    restore,
    status,
    switch,
    train,
    umount,
)

#: in the order of `mlfs --help`
COMMANDS = (mount, umount, restore, status, switch, report, reports, train, demo, bench, config,
            fleet, backends, install)

#: one line per command for the top-level description; each command's help= says the rest
SUMMARY = """mlfs exchanges data and decisions between kernel subsystems and user-space ML
trainers through a FUSE filesystem: subsystems publish Parquet datasets, trainers
write recommendations and upload LightGBM policies into sysfs-style files.

commands: """

#: every command's examples, in the man page's order (tools/gen-cli-docs)
EXAMPLES = {
    "mlfs": """examples:
  mlfs demo                               # mount the simulated subsystem, train, summarise
  mlfs mount /mnt/mlfs --config /etc/mlfs/mlfs.toml
  mlfs status /mnt/mlfs
  mlfs umount /mnt/mlfs

Every command takes --help.  Manual page: mlfs(8).""",
    **{name: module.EXAMPLES for name, module in (
        ("mount", mount), ("umount", umount), ("status", status), ("report", report),
        ("reports", reports), ("train", train), ("demo", demo), ("bench", bench),
        ("backends", backends),
        ("restore", restore), ("fleet", fleet), ("config", config))},
    "emergency": switch.EMERGENCY_EXAMPLES,
    "auto": switch.AUTO_EXAMPLES,
    "install-units": install.EXAMPLES,
}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="mlfs", epilog=EXAMPLES["mlfs"],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mlfs {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands below; `mlfs COMMAND --help` says more")
    for module in COMMANDS:
        module.add_parser(sub)
    parser.description = SUMMARY + ", ".join(sub.choices) + "."
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    if argv and argv[0] not in commands and not argv[0].startswith("-") and "-o" in argv:
        # mount.fuse3 runs `mlfs none DIR -o OPTS` for fstab's `mlfs#none` form
        from ..mount_helper import main as helper_main

        return helper_main(argv)
    args = parser.parse_args(argv)
    return args.func(args)


def entry() -> None:
    """The `mlfs` console script: main(), then leave without C++ static teardown.

    pyarrow 26 sometimes aborts a process at exit ("terminate called without
    an active exception": its I/O thread pool, used by pre-buffered Parquet
    reads, is destroyed while a thread is still joinable) — seen on this
    machine in about 1 of 5 short scripts that read a portion, under load.
    Everything of ours is finished and flushed by then, so end the process
    directly rather than let a library's destructor turn success into SIGABRT.
    """
    import logging

    try:
        code = main()
        logging.shutdown()
        sys.stdout.flush()
    except BrokenPipeError:  # `mlfs backends | head`: the reader is gone, as with ls
        os._exit(141)  # what a shell reports for a command ended by SIGPIPE
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
