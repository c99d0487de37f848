"""What the real Linux backends share: kernel file I/O, the apply rules and the ledger.

The part users trust is here.  A real backend changes settings of the running
kernel (vm.* sysctls, block-queue attributes), so mlfs promises:

1. **Observe-only unless configured.**  A knob is written only if the
   subsystem's ``apply`` table lists it, and only within the configured
   bounds, which must themselves lie inside mlfs's hard bounds (`KnobSpec.lo`
   / `hi`, never wider than what the kernel accepts).  The one value always
   writable outside the bounds is the knob's original value (that is the
   restore).  The knob range a subsystem shows in ``info`` *is* the allowed
   range: ``[lo, hi]`` (or the allowed scheduler names) for an applied knob,
   and just the current value (``min == max``, one choice) for an observed
   one, so the proxy rejects a recommendation mlfs would not apply with
   EINVAL instead of recording a value in the dataset that never took effect.
2. **The original is durable before the first change.**  Before mlfs first
   writes a kernel file it records the file's current value in a *ledger*
   entry in the state directory (``STATE/ledger/<quoted path>.json``: written
   to a temporary file, fsynced, renamed, directory fsynced).  Each later
   write first adds the value about to be written to the entry's ``written``
   list the same way, so after a crash mlfs knows every value it may have
   left behind.
3. **Restored on stop, on unmount and after a crash.**  `KnobController.release`
   (a model stopped or removed) and `KnobController.close` (unmount, SIGTERM)
   write the original back and delete the entry.  A new controller first
   recovers every entry whose owner is gone (a different process that is no
   longer running, or a controller of this process that was dropped without
   `close`, which is how the tests simulate SIGKILL): if the file still holds
   the original or a value mlfs wrote, the original is written back; the
   entry is deleted.  Entries from before a reboot are dropped unrestored
   (the reboot reset the kernel).  A restore that fails (EINVAL, EBUSY) keeps
   its entry for the next start; a file that no longer exists (a detached
   device) drops it.
   An entry is validated when read (a kernel path under /sys or /proc/sys,
   string values, ...); a damaged one is set aside (`.damaged`, with a log
   line naming the original it still holds), never restored automatically,
   and never lost: `mlfs restore` (`restore_state_dir`) reads it.
4. **Someone else's change wins.**  When the value read back differs from the
   one mlfs last wrote, another party changed it: mlfs drops the ledger
   entry without restoring (the other party owns the setting now), never
   touches that knob again until the mount restarts, and reports
   ``Sample.extra["foreign"] = {knob: reason}`` once.  The same goes for a
   crash recovery that finds a value mlfs never wrote.
5. **A refusal is reported, not hammered.**  A write the kernel refuses
   (OSError) is reported in ``Sample.extra["refused"] = {knob: reason}`` once
   per distinct value; that value is not tried again for `RETRY_SECONDS`, and
   a repeated refusal is not reported again.  A value the configuration does
   not allow is reported the same way and never written.

Coupled kernel files are handled where the kernel couples them: writing
``vm.dirty_ratio`` zeroes ``vm.dirty_bytes`` (and the background pair alike),
so the ledger records both and restores the bytes form when that was the one
in use; switching the I/O scheduler resets ``nr_requests``, so the scheduler
is restored first and a scheduler write updates the expected ``nr_requests``.

Apply configuration (one table per subsystem)::

    apply = {read_ahead_kb = [16, 4096], scheduler = ["none", "mq-deadline"]}

Integer knobs take ``[lo, hi]`` (inclusive, inside the knob's hard bounds);
choice knobs take the list of names that may be written (each one the kernel
offers).  An empty or absent table means observe-only.  Applying needs a
state directory (for the ledger); a subsystem refuses to start without one.

The package is the toolkit a real-knob backend (ours or a third party's) imports, beside
`mlfs.abi` and nothing else (docs/writing-a-backend.md), one module per concern:

- `files`: kernel file I/O (`read_text`, `write_text`, the parsers, `UnavailableError`)
- `knobs`: `KnobSpec` and the `apply` rules (`parse_apply`)
- `ledger`: the durable originals (`Ledger`, `recover`, `restore_state_dir`)
- `controller`: `KnobController`, which applies and restores under the rules
- `subsystem`: `LinuxSubsystem`, the skeleton of a real backend

and the built-in backends made with it: `vm` (linux.vm), `block` (linux.block) and
`sysfs` (linux.sysfs).  This file imports nothing, so importing one module of the
toolkit does not import the others.
"""
