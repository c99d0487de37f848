"""The anomaly detector, daemon side: an isolation forest's verified policy and its proxy."""
