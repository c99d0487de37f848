"""linux.kmsg on a real mount: records written into /dev/kmsg in the kernel's formats, and
real block errors from a loop device over a full tmpfs, come out as rows and reports."""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from mlfs.client import EventStream
from tests.harness import Mount, metric, mlfs_command, sh, wait_for

DATA = Path(__file__).resolve().parent.parent / "data" / "kmsg"
KMSG_CONFIG = """
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0

[[subsystem]]
backend = "linux.kmsg"
tick_seconds = 0.1
start = "now"
"""


def inject(message: str, level: int = 4) -> None:
    """One record, as the kernel's printk would give it (/dev/kmsg limits each open file
    to 10 records per 5 s, so each record gets its own open).  The newline ends the record:
    without it the kernel keeps the record open for a continuation, and readers see it
    only when the next record arrives."""
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"<{level}>{message}\n".encode())
    finally:
        os.close(fd)


def rows(mount: Mount):
    sub = mount.mountpoint / "linux.kmsg"
    assert sh(f"echo prepare_dataset > {sub}/control").returncode == 0
    return ds.dataset(str(sub / "records"), format="parquet").to_table().to_pylist()


@pytest.fixture
def kmsg_mount(mount_root):
    if not os.access("/dev/kmsg", os.R_OK | os.W_OK):
        pytest.skip("/dev/kmsg needs root")
    mount = Mount(mount_root, KMSG_CONFIG)
    mount.start()
    try:
        yield mount
    finally:
        mount.kill(signal.SIGTERM)


def test_records_of_every_kind_become_rows_and_reports(kmsg_mount):
    sub = kmsg_mount.mountpoint / "linux.kmsg"
    formats = [line.split("\t") for line in (DATA / "formats.tsv").read_text().splitlines()]
    blocks = {}
    for path in sorted(DATA.glob("*.block")):  # first: a report keeps its first block whole
        title, *lines = path.read_text().splitlines()
        blocks[title] = lines
        for line in lines:
            inject(line)
    for _, _, _, message in formats:
        inject(message)
    inject("random: our marker after the formats")
    wait_for(lambda: any(r["message"] == "random: our marker after the formats"
                         for r in rows(kmsg_mount)), what="the injected records as rows")
    got: dict = {}
    for r in sorted(rows(kmsg_mount), key=lambda r: r["seq"]):
        if r["facility"] == 1:  # written from user space (the kernel's own may match too)
            got[r["message"]] = r  # the last: the formats come after the blocks' headers
    for kind, device, signature, message in formats:
        row = got[message]
        assert (row["kind"], row["device"] or "-", row["signature"]) == (kind, device, signature)
    reports = {p.name: p.read_text() for p in (sub / "reports").iterdir()}
    titles = {text.splitlines()[0].removeprefix("title: ") for text in reports.values()}
    assert set(blocks) <= titles, titles
    warning = next(t for t in reports.values() if "WARNING in ext4_set_page_dirty" in t)
    assert "---[ end trace 0000000000000000 ]---" in warning  # the whole first block
    assert "count: 2" in warning  # the block, then the same header alone in the formats
    mode = (sub / "reports" / next(iter(reports))).stat().st_mode
    assert stat.S_IMODE(mode) == 0o440
    portion = next((sub / "records").glob("*.parquet"))
    assert stat.S_IMODE(portion.stat().st_mode) == 0o440
    info = json.loads((sub / "info").read_text())
    assert info["records"]["signature"] == "string"


def test_a_loop_device_over_a_full_tmpfs_gives_io_error_rows_with_its_device(kmsg_mount,
                                                                             tmp_path):
    tmpfs = tmp_path / "small"
    tmpfs.mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(tmpfs)]
                          ).returncode == 0
    device = None
    try:
        image = tmpfs / "disk.img"
        with open(image, "wb") as fh:
            fh.truncate(64 << 20)  # sparse: the tmpfs holds 4 MiB of it
        device = subprocess.run(["losetup", "--find", "--show", str(image)],
                                capture_output=True, text=True, check=True).stdout.strip()
        name = os.path.basename(device)
        def logged() -> bool:
            return any(r["kind"] == "io_error" and r["device"] == name
                       for r in rows(kmsg_mount))

        # the kernel rate-limits these messages (10 per 5 s, per call site): right after
        # another test's failing disk ours may be suppressed, so write again (after the
        # 5 s interval) until one is logged
        for _ in range(6):
            subprocess.run(["dd", "if=/dev/zero", f"of={device}", "bs=1M", "count=16",
                            "oflag=direct"], capture_output=True)
            deadline = time.monotonic() + 6
            while not logged() and time.monotonic() < deadline:
                time.sleep(0.1)
            if logged():
                break
        wait_for(logged, what=f"an io_error row for {name}")
        errors = [r for r in rows(kmsg_mount) if r["device"] == name]
        assert any("critical space allocation error, dev " + name in r["message"]
                   for r in errors)
        assert all(r["kind"] == "io_error" for r in errors
                   if "error, dev" in r["message"])
    finally:
        if device:
            subprocess.run(["losetup", "-d", device], capture_output=True)
        subprocess.run(["umount", "-l", str(tmpfs)], capture_output=True)


def test_records_written_while_the_daemon_is_down_are_read_after_a_restart(kmsg_mount):
    inject("random: before the crash")
    wait_for(lambda: any(r["message"] == "random: before the crash" for r in rows(kmsg_mount)),
             what="the first record")
    os.kill(kmsg_mount.pid, signal.SIGKILL)
    wait_for(lambda: not kmsg_mount.alive(), what="the daemon gone")
    kmsg_mount.pid = None
    for i in range(5):
        inject(f"random: while down {i}")
    kmsg_mount.start()
    wait_for(lambda: sum(r["message"].startswith("random: while down") for r in
                         rows(kmsg_mount)) == 5, what="the records written while down")
    seqs = sorted(r["seq"] for r in rows(kmsg_mount))
    first = seqs[0]
    assert set(range(first, seqs[-1] + 1)) <= set(seqs)  # no record of the boot skipped


def test_an_overrun_ring_becomes_a_lost_row_with_its_count(kmsg_mount):
    inject("random: before the flood")
    wait_for(lambda: any(r["message"] == "random: before the flood" for r in rows(kmsg_mount)),
             what="the first record")
    kmsg_mount.stop(signal.SIGTERM)  # the cursor is saved at the last record read
    filler = "random: flood " + "x" * 200
    for _ in range(900):  # ~200 KiB: more than the 128 KiB ring holds
        inject(filler)
    kmsg_mount.start()
    wait_for(lambda: any(r["kind"] == "lost" for r in rows(kmsg_mount)),
             what="a lost row")
    lost = [r for r in rows(kmsg_mount) if r["kind"] == "lost"]
    assert lost[0]["count"] > 0
    info = json.loads((kmsg_mount.mountpoint / "linux.kmsg" / "info").read_text())
    assert info["records_lost"] >= lost[0]["count"]


def test_mlfs_reports_lists_a_mounts_reports(kmsg_mount):
    sub = kmsg_mount.mountpoint / "linux.kmsg"
    with EventStream(sub / "events") as events:
        for line in (DATA / "warning.block").read_text().splitlines()[1:]:
            inject(line)
        inject("random: after the warning")
        event = events.wait_for(lambda e: e["event"] == "report", timeout=20)
    assert event is not None, "no report event"
    assert event["status"] == "new" and event["kind"] == "warning"
    assert "similarity" in event  # novel: the learned similarity's best match said so
    done = subprocess.run(mlfs_command("reports", str(kmsg_mount.mountpoint), "--json"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout)
    warning = next(r for r in reports if r["title"] == "WARNING in ext4_set_page_dirty")
    assert warning["kind"] == "warning" and warning["count"] >= 1
    assert warning["block"][-1] == "---[ end trace 0000000000000000 ]---"
    done = subprocess.run(mlfs_command("reports", str(kmsg_mount.mountpoint / "nosuch")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_two_hosts_push_and_fleet_reports_merges_one_signature_over_both(mount_root):
    if not os.access("/dev/kmsg", os.R_OK | os.W_OK):
        pytest.skip("/dev/kmsg needs root")
    store = mount_root / "store"
    token = os.urandom(4).hex()
    hosts = [Mount(mount_root, KMSG_CONFIG, name=f"host{i}") for i in (1, 2)]
    try:
        for host in hosts:
            host.start()
        inject(f"WARNING: CPU: 0 PID: 1 at fs/x.c:1 fleet_probe_{token}+0x1/0x2")
        inject("---[ end trace 0000000000000000 ]---")
        inject(f"alice-{token}[4242]: segfault at 0 ip 0000000000401000 sp 00007ffc00000000 "
               "error 4 in a.out[400000+1000]")
        for host in hosts:
            wait_for(lambda h=host: any(f"fleet_probe_{token}" in (r["signature"] or "")
                                        for r in rows(h)), what="the probe on each host")
            done = subprocess.run(mlfs_command("fleet", "push", str(host.mountpoint), "--store",
                                               str(store), "--state-dir", str(host.state_dir),
                                               "--once"), capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
        done = subprocess.run(mlfs_command("fleet", "reports", "--store", str(store), "--json"),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        merged = json.loads(done.stdout)
        probe = next(r for r in merged if r["title"] == f"WARNING in fleet_probe_{token}")
        assert probe["hosts"] == 2 and probe["count"] == 2 and probe["kind"] == "warning"
        assert merged[0]["hosts"] == 2  # most hosts first
        shipped = [r for path in store.glob("subsystem=linux.kmsg/host=*/kind=records/*.parquet")
                   for r in pq.read_table(path).to_pylist() if r["kind"] == "segfault"]
        assert shipped and all(f"alice-{token}" not in (r["message"] + r["signature"])
                               for r in shipped)  # command names never leave the host
        assert any(f"alice-{token}" in r["message"] for r in rows(hosts[0]))  # kept at home
    finally:
        for host in hosts:
            host.kill(signal.SIGTERM)


def test_a_kernel_log_that_cannot_be_read_is_one_line_and_exit_2(mount_root):
    config = mount_root / "bad.toml"
    config.write_text('[[subsystem]]\nbackend = "linux.kmsg"\npath = "/nonexistent/kmsg"\n')
    (mount_root / "mnt").mkdir()
    done = subprocess.run(mlfs_command("mount", str(mount_root / "mnt"), "--config",
                                       str(config), "--state-dir", str(mount_root / "state")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "/nonexistent/kmsg does not exist" in done.stderr
    assert not os.path.ismount(mount_root / "mnt")


def ticks(mount: Mount) -> int:
    """The kernel-log subsystem's ticks so far (mlfs_ticks_total{subsystem="linux.kmsg"})."""
    prefix = 'mlfs_ticks_total{subsystem="linux.kmsg"} '
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.startswith(prefix):
            return int(float(line[len(prefix):]))
    raise AssertionError("no mlfs_ticks_total for linux.kmsg")


def letters_token() -> str:
    """A unique token of letters past f: titles mask what looks like an address or a
    number, as syzbot's do, so a function named with hex digits would read ADDR."""
    return os.urandom(5).hex().translate(str.maketrans("0123456789abcdef", "ghijklmnopqrstuv"))


def test_a_report_whose_lines_span_ticks_is_made_and_no_record_is_dropped(kmsg_mount):
    """A BUG header, a 0.5 s pause (five ticks of 0.1 s), then its RIP line: one report
    named by the RIP line, and every record a row.  Before, the idle tick raised
    IndexError in `_close_block`: no report, the tick's records dropped (red team K7)."""
    token = letters_token()  # a hex token would be masked as ADDR in the title
    sub = kmsg_mount.mountpoint / "linux.kmsg"
    lines = ["BUG: unable to handle page fault for address: ffffffffc0001234",
             f"RIP: 0010:kmsg_split_{token}+0x1a/0x30", "---[ end trace 0000000000000000 ]---"]
    inject(f"random: before the split report {token}")
    inject(lines[0])

    def header_is_a_row() -> bool:  # so the rest comes in a later tick, after idle ones
        got = sorted(rows(kmsg_mount), key=lambda r: r["seq"])
        before = [r["seq"] for r in got if token in r["message"]]
        return bool(before) and any(r["message"] == lines[0] and r["seq"] > before[0]
                                    for r in got)
    wait_for(header_is_a_row, what="the header as a row")
    ticked = ticks(kmsg_mount)  # then five idle ticks pass before the rest is written
    wait_for(lambda: ticks(kmsg_mount) >= ticked + 5, what="five ticks after the header")
    for line in lines[1:]:
        inject(line)
    inject(f"random: after the split report {token}")
    title = f"BUG: unable to handle kernel paging request in kmsg_split_{token}"
    wait_for(lambda: any(p.read_text().startswith(f"title: {title}\n")
                         for p in (sub / "reports").iterdir()), what="the split report")
    wait_for(lambda: any(r["message"] == f"random: after the split report {token}"
                         for r in rows(kmsg_mount)), what="the record after it")
    got = [r for r in rows(kmsg_mount) if r["message"] in lines and r["facility"] == 1]
    header = max(r["seq"] for r in got if r["message"] == lines[0])
    ours = sorted((r for r in got if r["seq"] >= header), key=lambda r: r["seq"])
    assert [r["message"] for r in ours] == lines
    assert {r["block"] for r in ours} == {header}
    info = json.loads((sub / "info").read_text())
    assert info["records_lost"] == 0


def test_a_hung_task_report_with_no_end_marker_is_made_after_a_quiet_interval(kmsg_mount):
    token = letters_token()  # a hex token would be masked as ADDR in the title
    sub = kmsg_mount.mountpoint / "linux.kmsg"
    inject(f"INFO: task kw{token}:123 blocked for more than 120 seconds.")
    inject("Call Trace:")
    inject(f" hung_probe_{token}+0x10/0x20")
    title = f"INFO: task hung in hung_probe_{token}"
    wait_for(lambda: any(p.read_text().startswith(f"title: {title}\n")
                         for p in (sub / "reports").iterdir()),
             what="the hung-task report, closed by the quiet interval")


def test_a_non_member_reads_no_report_event_a_member_does(mount_root, tmp_path):
    """`events` files are 0444, the reports 0440: a report event carries the report's
    title, so it reaches root and the group only (red team K13).  Events carry one global
    sequence: once the outsider has read an event numbered past the report's, a report
    it was given would stand before it, so its absence is not a matter of timing."""
    if not os.access("/dev/kmsg", os.R_OK | os.W_OK):
        pytest.skip("/dev/kmsg needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as another user")
    config = KMSG_CONFIG.replace("allow_other = true\n",
                                 'allow_other = true\ngroup = "nogroup"\n')
    mount = Mount(mount_root, config)
    mount.start()
    readers: list[subprocess.Popen] = []
    outputs = {who: tmp_path / f"{who}.out" for who in ("outsider", "member")}

    def events_of(who: str) -> list[dict]:
        # every line before the last newline is whole (cat may be mid-write)
        return [json.loads(line) for line in outputs[who].read_text().split("\n")[:-1]]

    try:
        events = mount.mountpoint / "linux.kmsg" / "events"
        token = os.urandom(4).hex()
        groups = {"outsider": "12345", "member": str(grp.getgrnam("nogroup").gr_gid)}
        for who, gid in groups.items():
            with open(outputs[who], "wb") as out:
                readers.append(subprocess.Popen(
                    ["setpriv", "--reuid=65534", f"--regid={gid}", "--clear-groups",
                     "cat", str(events)], stdout=out))
        wait_for(lambda: metric(mount, "mlfs_event_readers") >= 2,
                 what="both readers' events files open")
        with EventStream(events) as stream:
            inject(f"leak{token}[4242]: segfault at 0 ip 0000000000401000 sp "
                   "00007ffc00000000 error 4 in a.out[400000+1000]")
            report = stream.wait_for(lambda e: e["event"] == "report" and token in e["title"])
            assert report is not None
        wait_for(lambda: any(e["seq"] == report["seq"] for e in events_of("member")),
                 what="the member reading the report event")
        wait_for(lambda: any(e["seq"] > report["seq"] for e in events_of("outsider")),
                 what="the outsider reading an event published after the report")
        assert not [e for e in events_of("outsider") if e["event"] == "report"]
        assert token not in outputs["outsider"].read_text()
    finally:
        for proc in readers:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        mount.kill(signal.SIGTERM)
