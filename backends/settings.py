"""Deprecated: the settings helpers are part of `mlfs.abi` (docs/writing-a-backend.md)."""

from ._moved import alias

alias(__name__, "mlfs.abi")
