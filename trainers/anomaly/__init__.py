"""The anomaly detector's trainer: an isolation forest fitted on a subsystem's records."""
