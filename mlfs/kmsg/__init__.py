"""The kernel log: blocks assembled into reports, their titles' words, report files."""
