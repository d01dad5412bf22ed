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
#include "tasks.h"

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

// Per CPU, [0] for the perf-event programs and [1] for switch_out: a page
// of the thread's memory that holds frames, copied at once (see take()).
#define WINDOW_BYTES 4096
struct window {
	// Words, not bytes: frames are 8-aligned, and a word loaded from a
	// byte array is compiled to eight byte loads and fourteen shifts and ors.
	__u64 q[(WINDOW_BYTES + MAX_FRAME_BYTES) / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct window);
} WINDOWS SEC(".maps");

#define WINDOW_TICK 0
#define WINDOW_SWITCH 1

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

// The words at `a` and `b` (either 0: not read) in one read of user
// memory where they lie within 64 bytes of each other: a read costs the
// target ~140 ns however little it copies. Where that read fails, each is
// read alone, so that each fails, and flags, as its own read would.
static __always_inline void pair(__u64 a, __u64 b, __u64 *va, __u64 *vb, __u16 *flags, __u16 fault_a, __u16 fault_b)
{
	__u64 lo = a < b ? a : b, hi = a < b ? b : a;
	if (a && b && hi - lo <= 56) {
		__u8 span[64] = {};
		__u32 len = (__u32)(hi - lo) + 8;
		if (len <= sizeof(span) && !bpf_probe_read_user(span, len, (const void *)lo)) {
			__u32 oa = (__u32)(a - lo), ob = (__u32)(b - lo);
			if (oa > 56)
				oa = 56;
			if (ob > 56)
				ob = 56;
			__builtin_memcpy(va, &span[oa], 8);
			__builtin_memcpy(vb, &span[ob], 8);
			return;
		}
	}
	*va = word(a, flags, fault_a);
	*vb = word(b, flags, fault_b);
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

// Where take() stands in its window (see copy_frame).
struct cursor {
	__u64 base;   /* the window holds [base, end) of the thread's memory */
	__u64 end;
	__u64 above;  /* the frame copied last: the one whose caller comes next */
	__u64 span;   /* the most the next window takes */
};

// One frame's place in a record: as much as any frame's copy takes, and
// its code's ident after the words it has.
struct frame_copy {
	__u64 w[FRAME_WORDS + 1];
};

// Copy the words of the frame at `frame` (fb bytes) that user space named
// in `t` to `to`. The frame's bytes come through the window `w`: a caller
// that lies just below the frame above it, as frames do in a data stack
// (3.11+) and often do on the heap, is copied with what lies below it in
// its page, and the callers further down in that copy come from it: one
// read from user memory for many frames, the same bytes at the same
// instant. A read costs the target ~140 ns here however little it copies;
// a 100-deep recursion took 13-16 µs of its CPU a sample, frame by frame.
// Each window of a chain may take twice the last, so a shallow stack
// copies little it does not need. Any other frame is read alone into the
// window. Only the words the walk reads go to the record: a whole frame is
// twice their bytes, and every byte of a record is copied into the ring and
// read out of it, cache-cold, on another CPU. Nonzero: the frame's page is
// not resident.
// Not inlined: verified once, not once per iteration of the frame loop.
__attribute__((noinline)) long copy_frame(struct frame_copy *to, const struct target *t, __u64 frame, struct window *w, struct cursor *c)
{
	if (!to || !t || !c || !w)
		return -1;
	__u32 fb = t->frame_bytes & (MAX_FRAME_BYTES - 8);
	__u64 above = c->above;
	c->above = frame;
	if (frame < c->base || frame + fb > c->end) {
		__u64 base = frame;
		if (frame < above && above - frame < WINDOW_BYTES) {
			// Within the frame's page: those bytes are resident if the
			// frame's are, so the read fails only where the frame's own would.
			base = frame & ~(__u64)(WINDOW_BYTES - 1);
			if (frame + fb - base > c->span)
				base = frame + fb - c->span;
			if (c->span < WINDOW_BYTES)
				c->span *= 2;
		}
		__u64 len = frame + fb - base;
		if (len > sizeof(w->q))
			return -1;
		len &= 8191;  // the verifier's own bound for it
		long err = bpf_probe_read_user(w->q, len, (const void *)base);
		c->base = err ? 0 : base;
		c->end = err ? 0 : frame + fb;
		if (err)
			return err;
	}
	// Loads and stores, no helper.
	__u32 at = ((frame - c->base) & (WINDOW_BYTES - 1)) / 8;
	__u32 nw = t->nwords;
#pragma unroll
	for (int j = 0; j < FRAME_WORDS; j++) {
		if (j >= nw)
			break;
		to->w[j] = w->q[at + (t->words[j] & (MAX_FRAME_BYTES / 8 - 1))];
	}
	return 0;
}

// Copy the interrupted thread's frame chain (and the words that go with
// it) into `r`, through the window `w` (see copy_frame). Returns the
// record's length.
static __always_inline __u64 take(struct record *r, const struct target *t, __u32 tgid, __u32 tid, __u64 now, __u32 which)
{
	struct window *w = bpf_map_lookup_elem(&WINDOWS, &which);
	struct cursor c = {.span = 512};
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
	__u32 nw = t->nwords;
	if (nw > FRAME_WORDS)
		nw = FRAME_WORDS;
	__u32 kept = nw * 8;
	__u32 prev = t->previous_at & (FRAME_WORDS * 8 - 8);
	h->frame_bytes = kept;
	struct thread *th = bpf_map_lookup_elem(&THREADS, &tid);
	h->tstate = th ? th->tstate : 0;
	if (!th) {
		// A thread user space has not mapped yet: it learns of it here.
		h->flags |= FLAG_NO_TSTATE;
		goto send;
	}
	__u64 frame = 0, tracing = 0;
	pair(h->tstate + t->frame_off, t->tracing_off != NO_FIELD ? h->tstate + t->tracing_off : 0, &frame, &tracing, &h->flags, FLAG_FAULT,
	     FLAG_WORD_FAULT);
	h->tracing = (__u32)tracing;
	if (t->cframe_off != NO_CFRAME && frame)
		frame = word(frame + t->cframe_off, &h->flags, FLAG_FAULT);
	h->frame = frame;
	__u32 code_at = t->code_at & (FRAME_WORDS * 8 - 8);
	if (h->flags || fb < 8 || kept < 8 || prev + 8 > kept || code_at + 8 > kept)
		goto words;
	__u32 max = t->max_frames;
	__u32 off = 0;
	__u64 last_code = 0, last_ident = 0;
	for (__u32 i = 0; i < MAX_FRAMES; i++) {
		if (!frame)
			break;
		if (i >= max || off > RECORD_DATA - sizeof(struct frame_copy)) {
			h->flags |= FLAG_TRUNCATED;
			break;
		}
		struct frame_copy *fc = (struct frame_copy *)&r->data[off];
		if (copy_frame(fc, t, frame, w, &c)) {
			// Not resident: a perf interrupt cannot fault a page in.
			h->flags |= FLAG_FAULT;
			break;
		}
		__u64 code = fc->w[code_at / 8] & ~t->code_mask;
		__u64 *id = &fc->w[nw];
		if (i > 0 && code == last_code) {
			// Recursion names one code object frame after frame, read
			// once in this same instant: a read of its ident per frame
			// was half of a 100-deep recursion's cost.
			*id = last_ident;
		} else if (ident(t, code, id)) {
			// Unprovable, so not kept: the chain ends above this frame.
			h->flags |= FLAG_FAULT;
			break;
		} else {
			last_code = code;
			last_ident = *id;
		}
		frame = fc->w[prev / 8];
		off += kept;
		off += IDENT_BYTES;
		h->nframes = i + 1;
	}
	// The loop's own bound reached with the chain going on.
	if (frame && !(h->flags & (FLAG_FAULT | FLAG_TRUNCATED)))
		h->flags |= FLAG_TRUNCATED;
words:
	// After the frames: the GIL's words and the collector's flag (only the
	// GIL holder changes it: for this thread, set at this instant or not).
	pair(t->gil_locked, t->gil_holder, &h->gil_locked, &h->gil_holder, &h->flags, FLAG_WORD_FAULT, FLAG_WORD_FAULT);
	h->gc = word(t->gc, &h->flags, FLAG_WORD_FAULT);
send:;
	__u64 len = sizeof(struct header) + (__u64)h->nframes * (kept + IDENT_BYTES);
	if (len > sizeof(struct record))
		len = sizeof(struct record);
	return len;
}

// Whether the current thread is inside execve. Once the kernel has put in
// the new image, and until exec_seen() takes the target out, the addresses
// user space gave are the old image's and mean nothing in the new one;
// before that, the thread's frames are the call to exec. Neither is taken
// (counted in COUNTS[2]). The syscall's number is in the registers saved as
// it entered the kernel; a thread interrupted in user space is in no
// system call, and costs no look (most ticks of a busy target).
static __always_inline int in_exec(struct bpf_perf_event_data *ctx)
{
	if ((ctx->regs.cs & 3) == 3)
		return 0;
	struct pt_regs *saved = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u64 nr = 0;
	if (!saved || bpf_probe_read_kernel(&nr, sizeof(nr), &saved->orig_rax))
		return 0;
	if (nr != 59 && nr != 322)  // execve, execveat (x86-64)
		return 0;
	count(2);
	return 1;
}

// The interrupted thread (tgid, tid) and its target, if it is one and
// not inside execve.
static __always_inline struct target *sampled(struct bpf_perf_event_data *ctx, __u32 *tgid, __u32 *tid)
{
	__u64 id = bpf_get_current_pid_tgid();
	*tgid = id >> 32;
	*tid = (__u32)id;
	struct target *t = bpf_map_lookup_elem(&TARGETS, tgid);
	if (!t || in_exec(ctx))
		return 0;
	return t;
}

SEC("perf_event")
int capture(struct bpf_perf_event_data *ctx)
{
	__u32 tgid, tid;
	struct target *t = sampled(ctx, &tgid, &tid);
	if (!t)
		return 0;
	__u32 zero = 0;
	struct record *r = bpf_map_lookup_elem(&SCRATCH, &zero);
	if (!r)
		return 0;
	count(0);
	__u64 len = take(r, t, tgid, tid, bpf_ktime_get_ns(), WINDOW_TICK);
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
	__u64 len = take(r, t, tgid, tid, now, WINDOW_SWITCH);
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
	__u32 tgid, tid;
	struct target *t = sampled(ctx, &tgid, &tid);
	if (!t)
		return 0;
	__u32 cpu = bpf_get_smp_processor_id();
	struct native_record *r = bpf_map_lookup_elem(&NATIVE_SCRATCH, &cpu);
	if (!r)
		return 0;
	count(0);
	__u64 len = take(&r->r, t, tgid, tid, bpf_ktime_get_ns(), WINDOW_TICK);
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

// `--async`: TASKS_CFG (per target), PLANS (per type of a target), and the
// record with its tail being built (see tasks.h).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);            // tgid, as the host sees it
	__type(value, struct tasks_target);
} TASKS_CFG SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct plan_key);
	__type(value, struct plan);
} PLANS SEC(".maps");

// The objects waiting to be copied, and those copied, for one record.
struct walk {
	__u64 queue[TASKS_QUEUE];      // address | plan << 56
	__u64 seen[TASKS_SEEN];        // address | plan << 56, valid when seen_gen is gen
	__u32 seen_gen[TASKS_SEEN];
	__u32 gen;
	__u32 head;
	__u32 tail;
	__u32 tgid;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct walk);
} WALK SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tasks_tail);
} TAIL SEC(".maps");

struct tasks_record {
	struct record r;
	struct tasks_tail t;
};

// One record with its tail, per CPU (user space sets max_entries to the
// number of CPUs: larger than a per-CPU value may be).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tasks_record);
} TASKS_SCRATCH SEC(".maps");

#define PLAN_SHIFT 56
#define ADDR_MASK ((1ull << PLAN_SHIFT) - 1)
// Not a plan: the plan byte of a block copied by an op (an array, a slot).
#define BLOCK_PART 255

static __always_inline void push(struct walk *w, __u64 addr, __u8 plan)
{
	// A user-space object: aligned, above the first page, below 2^47.
	if (addr < 4096 || addr >= (1ull << 47) || (addr & 7))
		return;
	__u32 t = w->tail;
	if (t - w->head >= TASKS_QUEUE)
		return;
	w->queue[t & (TASKS_QUEUE - 1)] = addr | ((__u64)plan << PLAN_SHIFT);
	w->tail = t + 1;
}

// Whether `item` was copied already in this record; if not, it is now.
static __always_inline int seen(struct walk *w, __u64 item)
{
	__u32 h = (__u32)((item >> 3) * 0x9E3779B97F4A7C15ull >> 40);
	for (int k = 0; k < 4; k++) {
		__u32 i = (h + k) & (TASKS_SEEN - 1);
		if (w->seen_gen[i] != w->gen) {
			w->seen_gen[i] = w->gen;
			w->seen[i] = item;
			return 0;
		}
		if (w->seen[i] == item)
			return 1;
	}
	return 0;  // crowded: copied again rather than missed
}

// Copy [start, start + len) of user memory into the tail as a block.
// Returns where its bytes are in t->data, or -1.
static __always_inline long put(struct tasks_tail *t, __u64 start, __u64 len, __u8 plan)
{
	__u32 pos = t->len;
	asm volatile("" : "+r"(len));
	if (len == 0 || len > BLOCK_MAX)
		return -1;
	if (pos > TASKS_BYTES - BLOCK_MAX - sizeof(struct block)) {
		t->flags |= TASKS_FULL;
		return -1;
	}
	__u32 at = pos + sizeof(struct block);
	if (bpf_probe_read_user(&t->data[at], len, (const void *)start))
		return -1;
	struct block *b = (struct block *)&t->data[pos];
	b->addr = start;
	b->len = len;
	b->plan = plan;
	b->pad[0] = b->pad[1] = b->pad[2] = 0;
	t->len = at + ((len + 7) & ~7u);
	t->nblocks++;
	return at;
}

// The word at `off` of the block whose bytes are at `at` (`len` long); 0 outside it.
static __always_inline __u64 bword(struct tasks_tail *t, long at, long off, __u32 len)
{
	if (at < 0 || off < 0 || off + 8 > len)
		return 0;
	__u64 i = at + off;
	asm volatile("" : "+r"(i));  // checked as it is used (see step())
	if (i > TASKS_BYTES + BLOCK_MAX)
		return 0;
	return *(__u64 *)&t->data[i];
}

// The maps' values one record's walk works on, looked up once (a hash
// lookup of TASKS_CFG per object and per op was a third of its cost).
struct step_ctx {
	struct walk *w;
	struct tasks_tail *t;
	const struct tasks_target *cfg;
	__u32 tgid;
};

// What the ops of one object's plan work on (op_step's context).
struct ops_ctx {
	struct op ops[PLAN_OPS];
	struct step_ctx *sc;
	__u64 obj;
	long at;
	__u32 before;
	__u32 blen;
};

// One op of the plan an object was copied by (its block at `at`, the
// object itself `before` bytes into it).
static __always_inline void apply(struct walk *w, struct tasks_tail *t, const struct tasks_target *cfg, const struct op *op, __u64 obj, long at,
				  __u32 before, __u32 blen)
{
	long off = (long)before + op->off;
	switch (op->code) {
	case OP_PTR: {
		__u8 plan = op->plan;
		if (op->variant == 1 && !(bword(t, at, (long)before + op->count, blen) & 0xff))
			plan = 0;
		__u64 v = bword(t, at, off, blen);
		if (op->masked)
			v &= ~cfg->tag_mask;
		push(w, v, plan);
		break;
	}
	case OP_ITEMS: {
		__u64 n = bword(t, at, (long)before + op->count, blen);
		for (__u32 k = 0; k < OP_ITEMS_MAX; k++) {
			if (k >= n || k >= op->max)
				break;
			push(w, bword(t, at, off + 8 * k, blen), op->plan);
		}
		break;
	}
	case OP_ARRAY: {
		__u64 base = bword(t, at, off, blen);
		__u64 n = bword(t, at, (long)before + op->count, blen) + op->extra;
		__u32 stride = op->stride;
		if (n > op->max || n > OP_ARRAY_MAX || stride > BLOCK_MAX / OP_ARRAY_MAX || !base)
			break;
		__u32 bytes = (__u32)n * stride;
		long a = put(t, base, bytes, BLOCK_PART);
		for (__u32 k = 0; k < OP_ARRAY_MAX; k++) {
			if (k >= n || a < 0)
				break;
			push(w, bword(t, a, k * stride + op->key, bytes), op->plan);
		}
		break;
	}
	case OP_STACK: {
		__u64 end = 0;
		if (op->variant == STACK_END)
			end = bword(t, at, off, blen);
		else if (op->variant == STACK_DEPTH)
			end = bword(t, at, off, blen) + 8 * (__s64)(__s32)bword(t, at, (long)before + op->count, blen);
		else
			end = obj + op->off + 8 * (__s64)(__s32)bword(t, at, (long)before + op->count, blen);
		if (end & 7)
			break;
		__u64 slot = end - 8 * (__u64)cfg->awaited_slot;
		long a = put(t, slot, 8, BLOCK_PART);
		__u64 v = bword(t, a, 0, 8);
		if (op->masked)
			v &= ~cfg->tag_mask;
		push(w, v, 0);
		break;
	}
	case OP_DICT: {
		__u64 keys = bword(t, at, off, blen);
		__u64 hdr[8] = {};
		if (!keys || bpf_probe_read_user(hdr, sizeof(hdr), (const void *)keys))
			break;
		__u64 idx;
		if (cfg->dict_variant == DICT_SIZE) {
			idx = hdr[(cfg->keys_size / 8) & 7];
			if (idx > 128)
				break;
		} else {
			__u32 lg = (__u32)(hdr[(cfg->keys_size / 8) & 7] >> (8 * (cfg->keys_size & 7))) & 0xff;
			if (lg > 7)
				break;
			idx = 1ull << lg;
		}
		__u64 n = hdr[(cfg->keys_nentries / 8) & 7];
		__u32 es = cfg->entry_size;
		if (n > OP_ARRAY_MAX || es > 32)
			break;
		__u64 entries = cfg->keys_indices + idx;
		__u64 bytes = entries + n * es;
		if (bytes > BLOCK_MAX || bytes < cfg->keys_header)
			break;
		long a = put(t, keys, (__u32)bytes, BLOCK_PART);
		for (__u32 k = 0; k < OP_ARRAY_MAX; k++) {
			if (k >= n || a < 0)
				break;
			push(w, bword(t, a, entries + k * es + cfg->entry_value, (__u32)bytes), op->plan);
		}
		break;
	}
	case OP_VALUES: {
		__u64 p = bword(t, at, off, blen);
		if (op->variant == VALUES_TAGGED) {
			if (!(p & op->extra))
				break;
			p += op->extra;
		}
		__u32 bytes = op->key + 8 * ((__u32)op->count + 1);
		if (!p || bytes > BLOCK_MAX)
			break;
		long a = put(t, p, bytes, BLOCK_PART);
		push(w, bword(t, a, bytes - 8, bytes), op->plan);
		break;
	}
	}
}

static long op_step(__u32 j, void *c)
{
	struct ops_ctx *oc = c;
	struct step_ctx *sc = oc->sc;
	struct walk *w = sc->w;
	struct tasks_tail *t = sc->t;
	const struct tasks_target *cfg = sc->cfg;
	if (!w || !t)
		return 1;
	asm volatile("" : "+r"(j));
	if (!cfg || j >= PLAN_OPS)
		return 1;
	struct op op = oc->ops[j];
	if (op.code == OP_NONE)
		return 1;
	apply(w, t, cfg, &op, oc->obj, oc->at, oc->before, oc->blen);
	return 0;
}

// Copy the next waiting object by its plan and queue what it points at.
static long step(__u32 i, void *c)
{
	struct step_ctx *sc = c;
	struct walk *w = sc->w;
	struct tasks_tail *t = sc->t;
	const struct tasks_target *cfg = sc->cfg;
	if (!w || !t || !cfg || w->head == w->tail)
		return 1;
	__u64 item = w->queue[w->head & (TASKS_QUEUE - 1)];
	w->head++;
	if (seen(w, item))
		return 0;
	t->objects++;
	__u64 obj = item & ADDR_MASK;
	__u32 pn = (__u32)(item >> PLAN_SHIFT);
	const struct plan *p;
	if (pn) {
		__u32 ix = pn - 1;
		if (ix >= FIXED_PLANS)
			return 0;
		// Keeps clang from computing the address before the check,
		// which the verifier then refuses.
		asm volatile("" : "+r"(ix));
		if (ix >= FIXED_PLANS)
			return 0;
		p = &cfg->fixed[ix];
	} else {
		__u64 ty = 0;
		if (bpf_probe_read_user(&ty, sizeof(ty), (const void *)(obj + cfg->ob_type)))
			return 0;
		struct plan_key k = {.tgid = sc->tgid, .pad = 0, .type = ty};
		p = bpf_map_lookup_elem(&PLANS, &k);
		if (!p) {
			// A type user space has not seen yet: its header, from
			// which user space learns it (and plans it for next time).
			put(t, obj, cfg->ob_type + 8, 0);
			return 0;
		}
	}
	__u32 before = p->before, len = p->len;
	if (before > BLOCK_MAX || len > BLOCK_MAX || before + len > BLOCK_MAX || before + len == 0)
		return 0;
	long at = put(t, obj - before, before + len, (__u8)pn);
	if (at < 0)
		return 0;
	// The ops in a loop of their own: verified once, not once per op.
	struct ops_ctx oc = {.sc = sc, .obj = obj, .at = at, .before = before, .blen = before + len};
	__builtin_memcpy(oc.ops, p->ops, sizeof(oc.ops));
	bpf_loop(PLAN_OPS, op_step, &oc, 0);
	return 0;
}

// The interrupted thread's task graph into TAIL: from its running task
// (3.14+: its thread state's word) or the dict of every loop's running
// task (older). Returns the tail's length, or 0 for none.
static __always_inline __u32 walk_tasks(const struct tasks_target *cfg, __u32 tgid, __u64 tstate)
{
	__u32 zero = 0;
	struct walk *w = bpf_map_lookup_elem(&WALK, &zero);
	struct tasks_tail *t = bpf_map_lookup_elem(&TAIL, &zero);
	if (!w || !t)
		return 0;
	w->gen++;
	w->head = w->tail = 0;
	w->tgid = tgid;
	t->nblocks = t->len = t->objects = t->flags = 0;
	if (cfg->running_task != NO_FIELD) {
		long a = put(t, tstate + cfg->running_task, 8, BLOCK_PART);
		push(w, bword(t, a, 0, 8), PLAN_TASK);
	}
	push(w, cfg->root, PLAN_DICT);
	struct step_ctx sc = {.w = w, .t = t, .cfg = cfg, .tgid = tgid};
	bpf_loop(TASKS_OBJECTS, step, &sc, 0);
	if (w->head != w->tail)
		t->flags |= TASKS_BOUND;
	return t->len;
}

// `--async`: the same record, then the objects of the thread's task graph
// as they were at the interrupt (tasks.h).
SEC("perf_event")
int capture_tasks(struct bpf_perf_event_data *ctx)
{
	__u32 tgid, tid;
	struct target *t = sampled(ctx, &tgid, &tid);
	if (!t)
		return 0;
	__u32 cpu = bpf_get_smp_processor_id();
	struct tasks_record *r = bpf_map_lookup_elem(&TASKS_SCRATCH, &cpu);
	if (!r)
		return 0;
	count(0);
	__u64 len = take(&r->r, t, tgid, tid, bpf_ktime_get_ns(), WINDOW_TICK);
	if (len > sizeof(struct record))
		return 0;
	struct tasks_target *cfg = bpf_map_lookup_elem(&TASKS_CFG, &tgid);
	if (cfg && r->r.h.nframes && r->r.h.tstate) {
		__u32 used = walk_tasks(cfg, tgid, r->r.h.tstate);
		__u32 zero = 0;
		struct tasks_tail *tail = bpf_map_lookup_elem(&TAIL, &zero);
		__u64 whole = 16 + (__u64)used;
		if (tail && whole <= 16 + TASKS_BYTES) {
			if (bpf_probe_read_kernel((__u8 *)r + len, whole, tail) == 0) {
				r->r.h.flags |= FLAG_TASKS;
				len += whole;
			}
		}
	}
	if (len > sizeof(struct tasks_record))
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
