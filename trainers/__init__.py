"""User-space trainers for mlfs: the learning core and the mount worker.

`trainers.knob.learner` learns from tables and never touches a mount (tests run it
directly); `trainers.knob.worker` is the `mlfs train` process around it.
"""
