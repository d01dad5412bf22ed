// SPDX-License-Identifier: MIT OR GPL-2.0
//
// pyprof's capture program, run at each tick of a cpu-clock perf event.
// It knows nothing of any CPython version: user space hands it, per target
// process, where the current-frame pointer sits in a thread state (through
// at most one pointer), where `previous` sits in a frame, and how many bytes
// of each frame to copy. It copies the interrupted thread's frame chain as
// it is at the interrupt (the thread cannot run meanwhile, and only it
// writes its own frames), with a word per frame that tells its code object
// from any later one at the same address (see ident()), and sends it to
// user space, which walks the copy with the same code and the same rules as
// a stop-and-read sample.
//
// Build with scripts/build-bpf.sh; the object is committed (src/kernel/bpf/
// capture.bpf.o) so building pyprof needs no clang.

#include <linux/bpf.h>
#include <linux/types.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "capture.h"

// Frames copied per sample: the walk's bound. User space lowers it so that
// max_frames * frame_bytes fits the record (>= 256 frames for any layout).
#define MAX_FRAMES 512

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);           // tgid, as the host sees it
	__type(value, struct target);
} TARGETS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);           // tid, as the host sees it
	__type(value, struct thread);
} THREADS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings);
} SETTINGS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} RECORDS SEC(".maps");

// One record being built, per CPU (too large for the BPF stack).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct record);
} SCRATCH SEC(".maps");

// The switch program's record being built, per CPU: its own, so that
// nothing it shares can be overwritten by a capture on the same CPU.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct record);
} SWITCH_SCRATCH SEC(".maps");

// `--native`: one record with its native tail, per CPU (user space sets
// max_entries to the number of CPUs; larger than a per-CPU value may be).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct native_record);
} NATIVE_SCRATCH SEC(".maps");

// `--native`: host tid -> the user registers it last left its CPU with
// (wall mode unwinds the C stacks of threads on no CPU from them).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct left);
} LEFT SEC(".maps");

// Per CPU: [0] ticks that hit a target, [1] records lost (ring full),
// [2] ticks that hit a target thread inside execve (not taken).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u64);
} COUNTS SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&COUNTS, &which);
	if (c)
		*c += 1;
}

static __always_inline __u64 word(__u64 addr, __u16 *flags, __u16 fault)
{
	__u64 v = 0;
	if (addr && bpf_probe_read_user(&v, sizeof(v), (const void *)addr))
		*flags |= fault;
	return v;
}

static __always_inline __u64 mix(__u64 name, __u64 a, __u64 b)
{
	return name * 0x9E3779B97F4A7C15ull ^ a ^ b * 0xC2B2AE3D27D4EB4Full;
}

// What tells this code object apart from any later one at its address (see
// capture.h), read now, while the frame that names it keeps it alive. User
// space reads the same words when it names the object, and names the frame
// only if they agree. Mirrored by kernel::ident. Nonzero: a read failed.
// Not inlined: verified once, not once per iteration of the frame loop
// (inlined, it took the verifier 150 ms of pyprof's start).
__attribute__((noinline)) long ident(const struct target *t, __u64 code, __u64 *out)
{
	if (!t || !out)
		return -1;
	*out = 0;
	if (!code)
		return 0;
	if (t->ident_kind == IDENT_WORD) {
		__u64 span[IDENT_SPAN / 8] = {};
		__u32 len = t->span_len & (IDENT_SPAN - 8);
		__u32 at = (t->span_name / 8) & (IDENT_SPAN / 8 - 1);
		if (len < 8)
			return 0;
		long err = bpf_probe_read_user(span, len, (const void *)(code + t->ident_off));
		*out = mix(span[at], span[0], 0);
		return err;
	}
	if (t->ident_kind != IDENT_NAME)
		return 0;
	__u64 w = 0;
	long err = bpf_probe_read_user(&w, sizeof(w), (const void *)(code + t->ident_off));
	if (err || !w)
		return err;
	__u64 hs[2] = {0, 0};  // hash, then the state word
	__u64 first = 0;
	err = bpf_probe_read_user(hs, sizeof(hs), (const void *)(w + t->hash_off));
	if (!err)
		err = bpf_probe_read_user(&first, sizeof(first), (const void *)(w + ((hs[1] & t->ascii_mask) ? t->ascii_data : t->compact_data)));
	*out = mix(w, hs[0], first);
	return err;
}

// Copy the interrupted thread's frame chain (and the words that go with
// it) into `r`. Returns the record's length.
static __always_inline __u64 take(struct record *r, const struct target *t, __u32 tgid, __u32 tid, __u64 now)
{
	struct header *h = &r->h;
	h->time_ns = now;
	h->pid = tgid;
	h->tid = tid;
	h->cpu = bpf_get_smp_processor_id();
	h->flags = 0;
	h->nframes = 0;
	h->frame = 0;
	h->gil_locked = 0;
	h->gil_holder = 0;
	h->gc = 0;
	h->tracing = 0;
	__u32 fb = t->frame_bytes & (MAX_FRAME_BYTES - 8);
	__u32 prev = t->previous_off & (MAX_FRAME_BYTES - 8);
	h->frame_bytes = fb;
	struct thread *th = bpf_map_lookup_elem(&THREADS, &tid);
	h->tstate = th ? th->tstate : 0;
	if (!th) {
		// A thread user space has not mapped yet: it learns of it here.
		h->flags |= FLAG_NO_TSTATE;
		goto send;
	}
	__u64 frame = word(h->tstate + t->frame_off, &h->flags, FLAG_FAULT);
	if (t->cframe_off != NO_CFRAME && frame)
		frame = word(frame + t->cframe_off, &h->flags, FLAG_FAULT);
	h->frame = frame;
	if (t->tracing_off != NO_FIELD)
		h->tracing = (__u32)word(h->tstate + t->tracing_off, &h->flags, FLAG_WORD_FAULT);
	__u32 code_off = t->code_off & (MAX_FRAME_BYTES - 8);
	if (h->flags || fb < 8 || prev + 8 > fb || code_off + 8 > fb)
		goto words;
	__u32 max = t->max_frames;
	__u32 off = 0;
	for (__u32 i = 0; i < MAX_FRAMES; i++) {
		if (!frame)
			break;
		if (i >= max || off > RECORD_DATA - MAX_FRAME_BYTES - IDENT_BYTES) {
			h->flags |= FLAG_TRUNCATED;
			break;
		}
		if (bpf_probe_read_user(&r->data[off], fb, (const void *)frame)) {
			// Not resident: a perf interrupt cannot fault a page in.
			h->flags |= FLAG_FAULT;
			break;
		}
		__u64 code = *(__u64 *)&r->data[off + code_off] & ~t->code_mask;
		if (ident(t, code, (__u64 *)&r->data[off + fb])) {
			// Unprovable, so not kept: the chain ends above this frame.
			h->flags |= FLAG_FAULT;
			break;
		}
		frame = *(__u64 *)&r->data[off + prev];
		off += fb;
		off += IDENT_BYTES;
		h->nframes = i + 1;
	}
words:
	// After the frames: the GIL's words and the collector's flag (only the
	// GIL holder changes it: for this thread, set at this instant or not).
	h->gil_locked = word(t->gil_locked, &h->flags, FLAG_WORD_FAULT);
	h->gil_holder = word(t->gil_holder, &h->flags, FLAG_WORD_FAULT);
	h->gc = word(t->gc, &h->flags, FLAG_WORD_FAULT);
send:;
	__u64 len = sizeof(struct header) + (__u64)h->nframes * (fb + IDENT_BYTES);
	if (len > sizeof(struct record))
		len = sizeof(struct record);
	return len;
}

// Whether the current thread is inside execve. Once the kernel has put in
// the new image, and until exec_seen() takes the target out, the addresses
// user space gave are the old image's and mean nothing in the new one;
// before that, the thread's frames are the call to exec. Neither is taken
// (counted in COUNTS[2]). The syscall's number is in the registers saved as
// it entered the kernel; an interrupt from user space saves no number there.
static __always_inline int in_exec(void)
{
	struct pt_regs *saved = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u64 nr = 0;
	if (!saved || bpf_probe_read_kernel(&nr, sizeof(nr), &saved->orig_rax))
		return 0;
	if (nr != 59 && nr != 322)  // execve, execveat (x86-64)
		return 0;
	count(2);
	return 1;
}

SEC("perf_event")
int capture(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct target *t = bpf_map_lookup_elem(&TARGETS, &tgid);
	if (!t || in_exec())
		return 0;
	__u32 zero = 0;
	struct record *r = bpf_map_lookup_elem(&SCRATCH, &zero);
	if (!r)
		return 0;
	count(0);
	__u64 len = take(r, t, tgid, tid, bpf_ktime_get_ns());
	// No wakeup: user space drains on its own clock. A wakeup is an
	// irq_work, a self-interrupt on the target's CPU at every sample.
	if (bpf_ringbuf_output(&RECORDS, r, len, BPF_RB_NO_WAKEUP))
		count(1);
	return 0;
}

// The current thread's user registers, as it entered the kernel. Nonzero: unread.
static __always_inline long user_regs(struct left *out)
{
	struct pt_regs u = {};
	struct pt_regs *saved = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (!saved)
		return -1;
	long err = bpf_probe_read_kernel(&u, sizeof(u), saved);
	out->ip = u.rip;
	out->sp = u.rsp;
	out->bp = u.rbp;
	return err;
}

// A target thread leaving its CPU (the tracepoint runs on it, before the
// switch). Until it runs again nothing moves its frames or its registers:
// what is taken here is what it is while it stays off.
// `--mode wall`: the same record a tick takes, flagged FLAG_SWITCH_OUT, at
// most once per switch_gap_ns per thread, whether it was preempted or
// blocks; user space uses it for a tick that finds the thread off CPU since
// this very switch. A thread without one is read from user space at the
// tick, and a read races the thread's return to a CPU: a thread that
// blocks for a moment and wakes during the read gives no stack. Only
// preempted threads were recorded once, and 0.3 % of wall samples were
// lost that way to threads that block briefly and often.
// `--native`, wall mode: its user registers in LEFT, from which user
// space unwinds the C stack of a thread it proves off CPU.
// The tracepoint's arguments are not read: how the thread left does not
// matter, and a program that read prev_state (5.18+) would not attach on
// older kernels.
SEC("raw_tracepoint/sched_switch")
int switch_out(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct target *t = bpf_map_lookup_elem(&TARGETS, &tgid);
	if (!t)
		return 0;
	__u32 zero = 0;
	struct settings *s = bpf_map_lookup_elem(&SETTINGS, &zero);
	if (!s)
		return 0;
	if (s->keep_regs) {
		struct left u;
		if (user_regs(&u))
			bpf_map_delete_elem(&LEFT, &tid);
		else
			bpf_map_update_elem(&LEFT, &tid, &u, BPF_ANY);
	}
	if (!s->switch_gap_ns)
		return 0;
	struct thread *th = bpf_map_lookup_elem(&THREADS, &tid);
	if (!th)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now - th->switch_ns < s->switch_gap_ns)
		return 0;
	th->switch_ns = now;
	struct record *r = bpf_map_lookup_elem(&SWITCH_SCRATCH, &zero);
	if (!r)
		return 0;
	__u64 len = take(r, t, tgid, tid, now);
	r->h.flags |= FLAG_SWITCH_OUT;
	if (bpf_ringbuf_output(&RECORDS, r, len, BPF_RB_NO_WAKEUP))
		count(1);
	return 0;
}

// `--native`: the same record, then the thread's user registers and its
// stack from sp up, as much as is mapped, at most STACK_BYTES (user space
// unwinds the copy with its CFI unwinder, so the C stack is that of the
// very instant the Python frames were copied).
SEC("perf_event")
int capture_native(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct target *t = bpf_map_lookup_elem(&TARGETS, &tgid);
	if (!t || in_exec())
		return 0;
	__u32 cpu = bpf_get_smp_processor_id();
	struct native_record *r = bpf_map_lookup_elem(&NATIVE_SCRATCH, &cpu);
	if (!r)
		return 0;
	count(0);
	__u64 len = take(&r->r, t, tgid, tid, bpf_ktime_get_ns());
	if (len > sizeof(struct record))
		return 0;
	struct native_tail *tail = (struct native_tail *)((__u8 *)r + len);
	tail->len = 0;
	tail->pad = 0;
	if ((ctx->regs.cs & 3) == 3) {
		tail->ip = ctx->regs.rip;
		tail->sp = ctx->regs.rsp;
		tail->bp = ctx->regs.rbp;
	} else {
		// In the kernel (a system call, a fault): the user registers it
		// entered with, saved on its kernel stack.
		struct left u;
		if (user_regs(&u)) {
			r->r.h.flags |= FLAG_NO_REGS;
			goto send;
		}
		tail->ip = u.ip;
		tail->sp = u.sp;
		tail->bp = u.bp;
	}
	__u64 at = tail->sp;
	__u32 n = 0;
	for (__u32 i = 0; i <= STACK_BYTES / 4096; i++) {
		// Page by page: a read crossing the end of the stack's mapping
		// fails whole, and the last page is where the copy must stop.
		__u32 piece = 4096 - (__u32)(at & 4095);
		if (n > STACK_BYTES - 4096)
			break;
		if (bpf_probe_read_user(&tail->stack[n], piece, (const void *)at))
			break;
		n += piece;
		at += piece;
	}
	tail->len = n;
send:
	len += sizeof(struct native_tail) - STACK_BYTES + tail->len;
	r->r.h.flags |= FLAG_NATIVE;
	if (len > sizeof(struct native_record))
		return 0;
	if (bpf_ringbuf_output(&RECORDS, r, len, BPF_RB_NO_WAKEUP))
		count(1);
	return 0;
}

// A target process exec'd: the addresses user space gave for it were its
// old image's. It leaves TARGETS here, before the new program runs, and
// user space learns of it from a record flagged FLAG_EXEC (and attaches
// the new program afresh, if it is Python). Checking for an exec from user
// space instead left a window in which every tick read the new image at
// the old addresses: 152 stacks of `[truncated]` in one run.
SEC("raw_tracepoint/sched_process_exec")
int exec_seen(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&TARGETS, &tgid))
		return 0;
	bpf_map_delete_elem(&TARGETS, &tgid);
	struct header h = {};
	h.time_ns = bpf_ktime_get_ns();
	h.pid = tgid;
	h.tid = (__u32)id;
	h.cpu = bpf_get_smp_processor_id();
	h.flags = FLAG_EXEC;
	if (bpf_ringbuf_output(&RECORDS, &h, sizeof(h), BPF_RB_NO_WAKEUP))
		count(1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
