"""The mount's machinery: the exchange's tick, subsystem runtimes, loading, control
writes, actions, sealing, readers and metrics."""
