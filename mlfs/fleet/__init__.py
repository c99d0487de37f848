"""The fleet: statistics and learning across many mounts (docs/fleet.md)."""
