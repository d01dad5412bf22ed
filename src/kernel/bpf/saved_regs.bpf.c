// SPDX-License-Identifier: MIT OR GPL-2.0
//
// `--native`, wall mode: the user registers a thread saved as it last
// entered the kernel, for one whose registers the capture object never
// saw (asleep since before it ran). User space runs this task iterator
// over that one thread (its link names the tid) while proving the thread
// off CPU, so they are the registers it will leave with. /proc shows sp
// and ip only: without the frame pointer, an unwind through a
// frame-pointer build ended at its first such frame.
//
// An object of its own: aya 0.13 neither loads iterators nor accepts
// their section in an object it loads (src/kernel/saved_regs.rs loads
// this one with bpf(2)). It uses no map and calls helpers only, so its
// instructions need no relocation. Built with scripts/build-bpf.sh.

#include <linux/bpf.h>
#include <linux/types.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "capture.h"

struct task_struct;
struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
};
struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
};

SEC("iter/task")
int saved_regs(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task)
		return 0;
	struct pt_regs *saved = (struct pt_regs *)bpf_task_pt_regs(task);
	struct pt_regs u = {};
	if (!saved || bpf_probe_read_kernel(&u, sizeof(u), saved))
		return 0;
	struct left l = {.ip = u.rip, .sp = u.rsp, .bp = u.rbp};
	bpf_seq_write(ctx->meta->seq, &l, sizeof(l));
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
