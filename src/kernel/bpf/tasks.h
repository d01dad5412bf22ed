// SPDX-License-Identifier: MIT OR GPL-2.0
// `--async` under the kernel sampler: shared by capture.bpf.c and, mirrored
// field for field, src/kernel/tasks/plan.rs and src/kernel/tasks/blocks.rs.
//
// At the interrupt the program copies, after the thread's frames, the
// objects of its task graph: the running task, what awaits it, and so on.
// It knows no asyncio and no CPython version. User space gives it, per
// target, plans: how many bytes of an object to copy and which of its
// words point at further objects (ops), by the object's type (learned as
// user space meets the types) or fixed by where the pointer was found (a
// future's callback list is a list, whatever its type says).
#ifndef PYPROF_TASKS_H
#define PYPROF_TASKS_H

#define FLAG_TASKS 256       /* a tasks_tail follows the frames */

#define TASKS_BYTES 16384    /* blocks' bytes in one record, at most */
#define TASKS_OBJECTS 128    /* objects looked at per record, at most */
#define TASKS_QUEUE 256      /* objects waiting to be looked at (a power of two) */
#define TASKS_SEEN 256       /* objects already copied, hashed (a power of two) */
#define BLOCK_MAX 512        /* bytes of one block */
#define PLAN_OPS 4
#define OP_ITEMS_MAX 8       /* words an OP_ITEMS follows, at most */
#define OP_ARRAY_MAX 16      /* elements an OP_ARRAY or OP_DICT follows, at most */

/* What an op does with the object just copied (`obj`, its block `b`). */
#define OP_NONE 0
#define OP_PTR 1     /* follow b[off] (variant 1: with plan `plan` only if byte b[count] is set, else by type) */
#define OP_ITEMS 2   /* follow the b[count] words inline at b[off] (at most `max`) */
#define OP_ARRAY 3   /* copy the array of b[count] + extra elements of `stride` bytes at b[off]; follow each one's word at `key` */
#define OP_STACK 4   /* copy and follow the slot `awaited_slot` words below a value stack's end (variant: STACK_*) */
#define OP_DICT 5    /* the root dict: copy its keys object; follow each entry's value */
#define OP_VALUES 6  /* copy the values array at b[off] (variant VALUES_TAGGED: tagged); follow its word `count` (at `key` + 8 * count) */

#define STACK_END 0     /* end = b[off] */
#define STACK_DEPTH 1   /* end = b[off] + 8 * (s32)b[count] */
#define STACK_LOCALS 2  /* end = obj + off + 8 * (s32)b[count] */

#define VALUES_PTR 0
#define VALUES_TAGGED 1 /* followed only if the word's low bit is set, then + 1 */

#define DICT_SIZE 0     /* ≤ 3.10: dk_size, a u64; one-byte indices up to 255 slots */
#define DICT_LOG2 1     /* 3.11+: dk_log2_index_bytes, a u8 */

/* Plans fixed by where a pointer was found, numbered from 1 (0: by type). */
#define PLAN_TASK 1
#define PLAN_CORO 2      /* a task's coroutine */
#define PLAN_FRAME 3     /* ≤ 3.10: a coroutine's frame object */
#define PLAN_CODE 4      /* a frame's code object: its ident's bytes */
#define PLAN_NAME 5      /* a code object's name (IDENT_NAME) */
#define PLAN_LIST 6      /* a future's callbacks */
#define PLAN_PAIR 7      /* (callback, context): the callback, by type */
#define PLAN_CLOSURE 8   /* a function's closure: its cells */
#define PLAN_CELL 9
#define PLAN_SET 10      /* a task's awaiters, when more than one */
#define PLAN_DICT 11     /* ≤ 3.13: loop -> running task */
#define FIXED_PLANS 11

struct op {
	__u8 code;
	__u8 plan;      /* the followed object's plan: 0 by its type, else PLAN_* */
	__u8 variant;
	__u8 masked;    /* clear the stack-ref tag bits of the followed word */
	__s32 off;      /* from the object's address (before the object: negative) */
	__s32 count;
	__u16 stride;
	__u16 key;
	__u16 max;
	__u16 extra;
};

struct plan {
	__u32 before;   /* bytes copied before the object (pre-headers) */
	__u32 len;      /* bytes copied from the object on; before + len <= BLOCK_MAX */
	struct op ops[PLAN_OPS];
};

/* PLANS' key: a type's address in one target. */
struct plan_key {
	__u32 tgid;
	__u32 pad;
	__u64 type;
};

/* What user space tells the program about one target's tasks (TASKS_CFG). */
struct tasks_target {
	__u64 root;           /* ≤ 3.13: the dict loop -> running task, or 0 */
	__u64 tag_mask;       /* tag bits of a stack ref (3.14+), cleared where an op says */
	__u32 running_task;   /* 3.14+: the running task's word in a thread state, or NO_FIELD */
	__u32 ob_type;
	__u32 awaited_slot;   /* OP_STACK: the awaited object is this many words below the end */
	/* OP_DICT: the keys object's layout. */
	__u32 dict_variant;   /* DICT_* */
	__u32 keys_header;    /* bytes of its header */
	__u32 keys_size;      /* dk_size or dk_log2_index_bytes */
	__u32 keys_nentries;
	__u32 keys_indices;
	__u32 entry_size;
	__u32 entry_value;
	struct plan fixed[FIXED_PLANS];
};

/* A block in the tail: header, then `len` bytes, padded to 8. */
struct block {
	__u64 addr;     /* of its first byte */
	__u32 len;
	__u8 plan;      /* the plan it was copied by: PLAN_*, 0 by type */
	__u8 pad[3];
};

#define TASKS_FULL 1    /* out of room: objects were left out */
#define TASKS_BOUND 2   /* TASKS_OBJECTS looked at, more waiting */

struct tasks_tail {
	__u32 nblocks;
	__u32 len;      /* bytes of data used */
	__u32 objects;  /* objects looked at */
	__u32 flags;    /* TASKS_* */
	__u8 data[TASKS_BYTES + BLOCK_MAX + 64];
};

#endif
