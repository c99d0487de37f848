"""The shared base: rules the daemon, the fleet, backends and trainers all follow.

Durable writes, the portion format and the state directory's names, the policy
verifier, the sequential test, the clock, error lines and text parsing.  The base
imports nothing else of mlfs, so any part may import it without a circle.
"""
