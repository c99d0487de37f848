"""Deprecated: moved to `mlfs.backends.linux.subsystem` (docs/writing-a-backend.md)."""

from ._moved import alias

alias(__name__, "mlfs.backends.linux.subsystem")
