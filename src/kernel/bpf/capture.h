// SPDX-License-Identifier: MIT OR GPL-2.0
// Shared by capture.bpf.c and, mirrored field for field, src/kernel/record.rs.
#ifndef PYPROF_CAPTURE_H
#define PYPROF_CAPTURE_H

#define MAX_FRAME_BYTES 128
#define NO_CFRAME 0xffffffffu
#define NO_FIELD 0xffffffffu

#define FLAG_FAULT 1        /* a read failed (page not resident): chain ends */
#define FLAG_TRUNCATED 2    /* deeper than the bound */
#define FLAG_NO_TSTATE 4    /* tid not in THREADS yet */
#define FLAG_WORD_FAULT 8   /* a GIL or GC word could not be read */
#define FLAG_NATIVE 16      /* a native_tail follows the frames */
#define FLAG_NO_REGS 32     /* the user registers could not be read: no stack */
#define FLAG_SWITCH_OUT 64  /* taken as the thread left its CPU, not at a tick */
#define FLAG_EXEC 128       /* no stack: the process exec'd (exec_seen), its target removed */

/* How a frame's code object is told apart from one that later takes its
 * address, mixed into one word: IDENT_WORD, its `co_version` word (3.12+: no
 * other code object of the interpreter ever has it) and name pointer, both
 * read from one span of the object; IDENT_NAME (older), its name string's
 * pointer, hash and first characters. */
#define IDENT_NONE 0
#define IDENT_WORD 1
#define IDENT_NAME 2

/* A frame's copy in a record is only the words the walk reads, these many
 * at most (see kernel::frame_words). */
#define FRAME_WORDS 8

/* What user space tells the program about one target process. */
struct target {
	__u64 gil_locked;   /* address of the 8-byte word holding `locked`, or 0 */
	__u64 gil_holder;   /* address of `last_holder`, or 0 */
	__u64 gc;           /* address of the collector's `collecting` word, or 0 */
	__u64 code_mask;    /* tag bits of a frame's code word (3.14+ stack refs) */
	__u32 frame_off;    /* current frame (or cframe) pointer in a thread state */
	__u32 cframe_off;   /* current_frame in the cframe, or NO_CFRAME */
	__u32 frame_bytes;  /* bytes of a frame its words lie in, multiple of 8, < 128 */
	__u32 max_frames;
	__u32 tracing_off;  /* the int `tracing` in a thread state, or NO_FIELD */
	__u32 ident_kind;   /* IDENT_* */
	__u32 ident_off;    /* in the code object: the span (IDENT_WORD) or the name pointer */
	__u32 span_len;     /* IDENT_WORD: bytes of the span, <= IDENT_SPAN */
	__u32 span_name;    /* IDENT_WORD: the name pointer's offset in the span */
	__u32 hash_off;     /* in a str: its hash; its state word follows it */
	__u32 ascii_mask;   /* the state's `ascii` bit */
	__u32 ascii_data;   /* in a str: an ASCII one's characters */
	__u32 compact_data; /* in a str: another compact one's characters */
	__u32 nwords;       /* words of a frame the record keeps, <= FRAME_WORDS */
	__u8 words[FRAME_WORDS]; /* which (frame word indices, < frame_bytes / 8); repeats pad it */
	__u32 code_at;      /* the code word's place in a frame's copy (bytes) */
	__u32 previous_at;  /* `previous`'s place in a frame's copy (bytes) */
};

#define IDENT_SPAN 64

/* A thread user space knows: THREADS' value. */
struct thread {
	__u64 tstate;       /* its thread state's address */
	__u64 switch_ns;    /* when the switch program last took its record */
};

/* What the switch program does, for every target (SETTINGS[0]). */
struct settings {
	__u64 switch_gap_ns; /* a record at a switch-out at most this often per thread; 0: none */
	__u32 keep_regs;     /* --native: keep the user registers in LEFT */
	__u32 pad;
};

struct header {
	__u64 time_ns;      /* CLOCK_MONOTONIC */
	__u64 tstate;
	__u64 frame;        /* innermost frame's address */
	__u64 gil_locked;
	__u64 gil_holder;
	__u64 gc;
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u32 frame_bytes;  /* of each frame's copy in this record: nwords * 8 */
	__u16 nframes;
	__u16 flags;
	__u32 tracing;      /* the thread state's `tracing`: a hook runs */
};

#define RECORD_SIZE 32768
#define RECORD_DATA (RECORD_SIZE - sizeof(struct header))
/* Each frame in a record: the header's frame_bytes of it (its words the
 * target's `words` name, in that order), then its code's ident. */
#define IDENT_BYTES 8

struct record {
	struct header h;
	__u8 data[RECORD_DATA];
};

/* `--native`: the stack copied from sp up, at most this much. */
#define STACK_BYTES 65536

/* After a --native record's frames: the user registers at the interrupt
 * and `len` bytes of the stack from `sp` up. */
struct native_tail {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 len;
	__u32 pad;
	__u8 stack[STACK_BYTES];
};

/* `--native`: the user registers a thread last left its CPU with. */
struct left {
	__u64 ip;
	__u64 sp;
	__u64 bp;
};

struct native_record {
	struct record r;
	struct native_tail tail;
};

#endif
