// SPDX-License-Identifier: GPL-2.0
// The loader of blkreq.bpf.c for mlfs (backends/linux/bio.py): attach, then copy the
// ring buffer's records to stdout in bulk (48 bytes each, the layout of struct record),
// flushing at least every 100 ms (the BPF side wakes it per 1 MiB of records or 10 ms);
// a record with issue_ns = ~0 carries the kernel side's running count of records the
// ring had no room for, in `sector`.  "ready" on stderr
// once attached; exits on SIGTERM, SIGINT or a closed stdout.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/libbpf.h>
#include <bpf/bpf.h>
#include "blkreq.skel.h"

struct record {
	unsigned long long issue_ns, complete_ns, sector;
	unsigned int dev, bytes, pid, cmd_flags, queue_depth;
	int error;
};

static volatile sig_atomic_t stop;
static char out[1 << 20];
static size_t used;

static void on_signal(int sig) { (void)sig; stop = 1; }

static int flush_out(void)
{
	size_t done = 0;
	while (done < used) {
		ssize_t n = write(1, out + done, used - done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		done += (size_t)n;
	}
	used = 0;
	return 0;
}

static int on_record(void *ctx, void *data, size_t size)
{
	(void)ctx;
	if (size != sizeof(struct record))
		return 0;
	if (used + size > sizeof(out) && flush_out() < 0)
		return -1;
	memcpy(out + used, data, size);
	used += size;
	return 0;
}

int main(int argc, char **argv)
{
	unsigned int only = 0;
	if (argc == 2)
		only = (unsigned int)strtoul(argv[1], NULL, 0);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGPIPE, SIG_IGN);
	/* the daemon killed: no capture left behind.  Not PR_SET_PDEATHSIG, which fires
	 * when the *thread* that started this process ends (a run-time load is built in
	 * a worker thread that may end long before the daemon): the parent process is
	 * polled instead, every ring poll (100 ms) */
	pid_t parent = getppid();
	struct blkreq_bpf *skel = blkreq_bpf__open();
	if (!skel) {
		fprintf(stderr, "cannot open the BPF object\n");
		return 1;
	}
	skel->rodata->only_dev = only;
	if (blkreq_bpf__load(skel) || blkreq_bpf__attach(skel)) {
		fprintf(stderr, "cannot load or attach the BPF program: %s\n", strerror(errno));
		blkreq_bpf__destroy(skel);
		return 1;
	}
	struct ring_buffer *rb = ring_buffer__new(bpf_map__fd(skel->maps.records), on_record,
						  NULL, NULL);
	if (!rb) {
		fprintf(stderr, "cannot open the ring buffer\n");
		blkreq_bpf__destroy(skel);
		return 1;
	}
	fprintf(stderr, "ready\n");
	int ncpu = libbpf_num_possible_cpus();
	unsigned long long last_dropped = 0;
	unsigned long long *per_cpu = calloc((size_t)ncpu, sizeof(*per_cpu));
	int status = 0;
	while (!stop && getppid() == parent) {
		/* woken by a gathered batch, or after 100 ms: then consume what is there
		 * (records submitted without a wakeup) */
		int n = ring_buffer__poll(rb, 100);
		if (n < 0 && n != -EINTR) {
			status = 1;
			break;
		}
		if (ring_buffer__consume(rb) < 0) {
			status = 1;
			break;
		}
		unsigned int zero = 0;
		unsigned long long total = 0;
		if (per_cpu && !bpf_map_lookup_elem(bpf_map__fd(skel->maps.dropped), &zero, per_cpu))
			for (int i = 0; i < ncpu; i++)
				total += per_cpu[i];
		if (total != last_dropped) {
			struct record marker = {.issue_ns = ~0ULL, .sector = total};
			on_record(NULL, &marker, sizeof(marker));
			last_dropped = total;
		}
		if (used && flush_out() < 0)
			break;  /* the reader went away */
	}
	ring_buffer__consume(rb);
	flush_out();
	ring_buffer__free(rb);
	blkreq_bpf__destroy(skel);
	free(per_cpu);
	return status;
}
