"""Where a tick's data goes: the portion store, the record store, their one write-ahead
engine (wal.py) with its two codecs (wal_lines.py, arrow_codec.py), and the quarantine
of what cannot be replayed."""
