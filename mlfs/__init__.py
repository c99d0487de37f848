"""mlfs: the kernel <-> user-space ML exchange, as a FUSE filesystem.

The repository keeps the design card's layout (`mlfs/`, `backends/`,
`trainers/` at the top) but installs the last two as `mlfs.backends` and
`mlfs.trainers`, so mlfs claims no generic top-level name in site-packages.
That mapping is declared once, in pyproject.toml's package-dir table; pip
installs by it, and a checkout's `pip install -e` (each checkout has its own
venv) maps the names to that checkout.  Nothing here repeats it.
"""

from pathlib import Path

__version__ = "0.1.0"

_CHECKOUT = Path(__file__).resolve().parent.parent

#: the checkout this mlfs runs from (pyproject.toml beside it, the data directories
#: `systemd/`, `man/`, `completions/` not inside the package), or None for an
#: installed copy; only `mlfs install-units` asks, to find those files
SOURCE_TREE = (_CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file()
               and not (Path(__file__).parent / "units").exists() else None)
