"""Where a tick's data goes: the portion store, the record store, their write-ahead
logs and the quarantine of damaged lines."""
