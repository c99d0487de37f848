// SPDX-License-Identifier: GPL-2.0
// Per-request block I/O for mlfs (backends/linux/bio.py): one fixed-size record per
// request into a ring buffer, written when the request completes.  CO-RE (BTF-typed
// tracepoints, no tracefs and no kernel headers needed): block_rq_insert and
// block_bio_queue note who submitted the request (at issue it is often a kworker),
// block_rq_issue notes when it reached the driver and how many requests of its
// device were in flight, block_rq_complete emits the record.  This kernel now and then
// runs no program on block_rq_complete (nor on block_io_done, where the block layer
// counts the completion) for a request that completed: such a request is recorded when
// its struct request is issued again, which the block layer does only once it has
// completed (a requeue, block_rq_requeue, forgets it first), with its completion time
// and status unknown.  A record the ring has no room for is counted in `dropped`,
// never silently lost.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

struct record {
	__u64 issue_ns;
	__u64 complete_ns;
	__u64 sector;
	__u32 dev;
	__u32 bytes;
	__u32 pid;
	__u32 cmd_flags;
	__u32 queue_depth;
	__s32 error;
};

struct start {
	__u64 issue_ns;
	__u64 sector;
	__u32 pid;
	__u32 queue_depth;
	__u32 bytes;
	__u32 cmd_flags;
	__u32 recorded;  /* block_rq_complete emitted its record (if its delete was refused) */
	__u32 pad;
};

/* `error` of a request whose completion no program saw: the status is unknown */
#define ERROR_UNKNOWN (-2147483647 - 1)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} records SEC(".maps");

/* the loader is woken once 1 MiB of records has gathered (~21,800 records, ~0.2 s at
 * 100k requests/s; the ring holds 16 MiB) or 10 ms after its last wakeup, whichever
 * comes first: at most ~100 wakeups a second instead of one per request, and a record
 * reaches user space within ~10 ms (linux.block measures windows of tens of ms) */
#define WAKE_BYTES (1 << 20)
#define WAKE_NS (10 * 1000 * 1000ULL)
__u64 last_wake = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct request *);
	__type(value, struct start);
} started SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct request *);
	__type(value, __u32);
} submitter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

const volatile __u32 only_dev = 0;  /* 0: every device */

static __always_inline __u32 rq_dev(struct request *rq)
{
	struct gendisk *disk = BPF_CORE_READ(rq, q, disk);
	__u32 major = BPF_CORE_READ(disk, major);
	__u32 minor = BPF_CORE_READ(disk, first_minor);
	return (major << 20) | minor;
}

/* a request of `dev` whose issue was counted in `inflight` is no longer in flight */
static __always_inline void left_flight(__u32 dev)
{
	__u32 *n = bpf_map_lookup_elem(&inflight, &dev);
	if (n && *n > 0)
		__sync_fetch_and_add(n, -1);
}

/* one record into the ring, or a count in `dropped` when it has no room */
static __always_inline void emit(__u32 dev, struct start *s, __u64 sector, __u32 bytes,
				 __u32 cmd_flags, __s32 error, __u64 complete_ns)
{
	if (s)
		left_flight(dev);
	struct record *r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r) {
		__u32 zero = 0;
		__u64 *d = bpf_map_lookup_elem(&dropped, &zero);
		if (d)
			*d += 1;
		return;
	}
	r->issue_ns = s ? s->issue_ns : 0;
	r->complete_ns = complete_ns;
	r->sector = sector;
	r->dev = dev;
	r->bytes = bytes;
	r->pid = s ? s->pid : 0;
	r->cmd_flags = cmd_flags;
	r->queue_depth = s ? s->queue_depth : 0;
	r->error = error;
	/* wake the loader per batch (WAKE_BYTES, WAKE_NS), not per request: a wakeup per
	 * request is a context switch per request */
	__u64 now = bpf_ktime_get_ns();
	long wake = BPF_RB_NO_WAKEUP;
	if (now - last_wake >= WAKE_NS ||
	    bpf_ringbuf_query(&records, BPF_RB_AVAIL_DATA) >= WAKE_BYTES) {
		wake = BPF_RB_FORCE_WAKEUP;
		last_wake = now;  /* racing CPUs may both wake: harmless */
	}
	bpf_ringbuf_submit(r, wake);
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(rq_insert, struct request *rq)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	bpf_map_update_elem(&submitter, &rq, &pid, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(rq_issue, struct request *rq)
{
	__u32 dev = rq_dev(rq);
	if (only_dev && dev != only_dev)
		return 0;
	/* still here from this struct's last issue, not recorded and not requeued: that
	 * request completed with no program run (see the top) */
	struct start *before = bpf_map_lookup_elem(&started, &rq);
	if (before && !before->recorded) {
		emit(dev, before, before->sector, before->bytes, before->cmd_flags, ERROR_UNKNOWN, 0);
		before->recorded = 1;  /* once, should the update below be refused */
	}
	struct start s = {};
	s.issue_ns = bpf_ktime_get_ns();
	s.sector = BPF_CORE_READ(rq, __sector);
	s.bytes = BPF_CORE_READ(rq, __data_len);
	s.cmd_flags = BPF_CORE_READ(rq, cmd_flags);
	__u32 *pid = bpf_map_lookup_elem(&submitter, &rq);
	if (pid) {
		s.pid = *pid;
		bpf_map_delete_elem(&submitter, &rq);
	} else {
		s.pid = bpf_get_current_pid_tgid() >> 32;  /* issued in the submitter's context */
	}
	__u32 one = 1, *n = bpf_map_lookup_elem(&inflight, &dev);
	if (n) {
		s.queue_depth = __sync_fetch_and_add(n, 1);
	} else {
		bpf_map_update_elem(&inflight, &dev, &one, BPF_NOEXIST);
		s.queue_depth = 0;
	}
	bpf_map_update_elem(&started, &rq, &s, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	__u32 dev = rq_dev(rq);
	if (only_dev && dev != only_dev)
		return 0;
	/* its issue may not have been seen: issued before the capture attached, or the
	 * issue's map update refused (the hash map's per-CPU lock is busy when this runs
	 * in an interrupt on a CPU whose task was inside an update: about 1 request in
	 * 30,000 on a loop device).  Such a request is recorded all the same, with
	 * issue_ns 0 (unknown): a completed request is never left out */
	struct start *s = bpf_map_lookup_elem(&started, &rq);
	emit(dev, s, BPF_CORE_READ(rq, __sector), nr_bytes, BPF_CORE_READ(rq, cmd_flags), error,
	     bpf_ktime_get_ns());
	if (s) {
		s->recorded = 1;  /* the struct's next issue must not record it again if the
				   * delete is refused */
		bpf_map_delete_elem(&started, &rq);
	}
	return 0;
}

/* A request taken back before it completed (the driver was busy): issued again later,
 * it is the same request, not one whose completion went unseen */
SEC("tp_btf/block_rq_requeue")
int BPF_PROG(rq_requeue, struct request *rq)
{
	struct start *s = bpf_map_lookup_elem(&started, &rq);
	if (!s)
		return 0;
	left_flight(rq_dev(rq));
	bpf_map_delete_elem(&started, &rq);
	return 0;
}
