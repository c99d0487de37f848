"""Is block_rq_complete itself emitted for every request?  bpftrace beside the capture.

    mount -t tracefs nodev /sys/kernel/tracing   (if it is not mounted)
    .venv/bin/python docs/bench/bio-capture-runs/tracepoint_count.py 10   (as root)

Per run of 200,000 fio random reads on a fresh loop device: the records linux.bio's loader
wrote, the device's completed reads (/sys/block/<dev>/stat) and bpftrace's count of the
classic (perf) block:block_rq_complete tracepoint for the device, a consumer that shares
nothing with the capture but the tracepoint.  Its output at 329c23c is
tracepoint-count-329c23c.txt beside it: in every run the two counts agree, short of the
device's count when they are short, so the kernel did not emit the tracepoint for those
requests.  (kprobes on blk_update_request and blk_mq_end_request could not be attached
on this kernel.)
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_cnt import (  # noqa: E402  (beside this file)
    FIO,
    MARKER,
    RECORDS,
    completed_reads,
    device_number,
    loop_device,
    records_written,
    start_loader,
)


def main(runs: int) -> None:
    with loop_device() as dev:
        program = (f"tracepoint:block:block_rq_complete /args->dev == {device_number(dev)}/ "
                   "{ @tp = count(); }")
        for run in range(runs):
            with open(RECORDS, "wb") as out:
                loader = start_loader(dev, out)
                tracer = subprocess.Popen(["bpftrace", "-e", program], stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)
                time.sleep(6)  # bpftrace attaches
                before = completed_reads(dev)
                subprocess.run([*FIO, f"--filename=/dev/{dev}"], capture_output=True,
                               check=True)
                reads = completed_reads(dev) - before
                time.sleep(0.5)
                tracer.send_signal(signal.SIGINT)
                counted = [line.split(":")[1].strip() for line in
                           tracer.communicate()[0].splitlines() if line.startswith("@tp")]
                loader.send_signal(signal.SIGTERM)
                loader.wait()
            records = int((records_written()["issue_ns"] != MARKER).sum())
            print(f"run {run}: records {records}, device reads {reads}, "
                  f"block_rq_complete (bpftrace) {counted[0] if counted else '?'}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
