// SPDX-License-Identifier: MIT OR GPL-2.0
// Shared by capture.bpf.c and, mirrored field for field, src/kernel/record.rs.
#ifndef PYPROF_CAPTURE_H
#define PYPROF_CAPTURE_H

#define MAX_FRAME_BYTES 128
#define NO_CFRAME 0xffffffffu

#define FLAG_FAULT 1        /* a read failed (page not resident): chain ends */
#define FLAG_TRUNCATED 2    /* deeper than the bound */
#define FLAG_NO_TSTATE 4    /* tid not in THREADS yet */
#define FLAG_WORD_FAULT 8   /* a GIL, counter or GC word could not be read */

/* What user space tells the program about one target process. */
struct target {
	__u64 gil_locked;   /* address of the 8-byte word holding `locked`, or 0 */
	__u64 gil_holder;   /* address of `last_holder`, or 0 */
	__u64 counter;      /* address of the code-object counter, or 0 */
	__u64 gc;           /* address of the collector's `collecting` word, or 0 */
	__u32 frame_off;    /* current frame (or cframe) pointer in a thread state */
	__u32 cframe_off;   /* current_frame in the cframe, or NO_CFRAME */
	__u32 previous_off; /* `previous`/`f_back` in a frame */
	__u32 frame_bytes;  /* bytes copied per frame, multiple of 8, < 128 */
	__u32 max_frames;
	__u32 pad;
};

struct header {
	__u64 time_ns;      /* CLOCK_MONOTONIC */
	__u64 tstate;
	__u64 frame;        /* innermost frame's address */
	__u64 gil_locked;
	__u64 gil_holder;
	__u64 counter;
	__u64 gc;
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u32 frame_bytes;
	__u16 nframes;
	__u16 flags;
	__u32 pad;
};

#define RECORD_SIZE 32768
#define RECORD_DATA (RECORD_SIZE - sizeof(struct header))

struct record {
	struct header h;
	__u8 data[RECORD_DATA];
};

#endif
