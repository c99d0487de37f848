"""The FUSE-free core: subsystems, model proxies, stores, events, metrics."""
