//! What the capture program copies of a task graph: `bpf/tasks.h`'s structs,
//! mirrored field for field, and the plans made from a version's offsets.
//! Each plan covers the bytes `python::asyncio` reads of that kind of
//! object, and follows the words it follows; a plan is fixed where the
//! pointer's place says what it points at (a task's coroutine), else the
//! followed object is planned by its type, once user space has met it.

use crate::kernel::ident::{IDENT_NAME, IDENT_WORD, IdentRule};
use crate::kernel::record::NO_FIELD;
use crate::offsets::Offsets;
use crate::offsets::asyncio::{AsyncioOffsets, AwaiterLinks, GenFrame, ValueStack};
use crate::offsets::{KeysSize, NameOffsets};
use crate::python::asyncio::Kind;
use crate::python::objects::AttrSlot;

pub const BLOCK_MAX: u32 = 512;
pub const PLAN_OPS: usize = 4;

const OP_PTR: u8 = 1;
const OP_ITEMS: u8 = 2;
const OP_ARRAY: u8 = 3;
const OP_STACK: u8 = 4;
const OP_DICT: u8 = 5;
const OP_VALUES: u8 = 6;

const STACK_END: u8 = 0;
const STACK_DEPTH: u8 = 1;
const STACK_LOCALS: u8 = 2;
const VALUES_PTR: u8 = 0;
const VALUES_TAGGED: u8 = 1;
const DICT_SIZE: u32 = 0;
const DICT_LOG2: u32 = 1;

/// OP_PTR's variant: the fixed plan only if the byte at `count` is set.
const IF_FLAG: u8 = 1;

/// Fixed plans (`PLAN_*`), numbered from 1; 0 is "by the object's type".
pub const BY_TYPE: u8 = 0;
pub const PLAN_TASK: u8 = 1;
pub const PLAN_CORO: u8 = 2;
pub const PLAN_FRAME: u8 = 3;
pub const PLAN_CODE: u8 = 4;
pub const PLAN_NAME: u8 = 5;
pub const PLAN_LIST: u8 = 6;
pub const PLAN_PAIR: u8 = 7;
pub const PLAN_CLOSURE: u8 = 8;
pub const PLAN_CELL: u8 = 9;
pub const PLAN_SET: u8 = 10;
pub const PLAN_DICT: u8 = 11;
pub const FIXED_PLANS: usize = 11;

/// Most words of an inline array (`OP_ITEMS`) and elements of an array
/// (`OP_ARRAY`, `OP_DICT`) the program follows.
const ITEMS_MAX: u16 = 8;
const ARRAY_MAX: u16 = 16;

/// `struct op`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Op {
    pub code: u8,
    pub plan: u8,
    pub variant: u8,
    pub masked: u8,
    pub off: i32,
    pub count: i32,
    pub stride: u16,
    pub key: u16,
    pub max: u16,
    pub extra: u16,
}

/// `struct plan`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    pub before: u32,
    pub len: u32,
    pub ops: [Op; PLAN_OPS],
}

/// `struct plan_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanKey {
    pub tgid: u32,
    pub pad: u32,
    pub ty: u64,
}

/// `struct tasks_target`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TasksTarget {
    pub root: u64,
    pub tag_mask: u64,
    pub running_task: u32,
    pub ob_type: u32,
    pub awaited_slot: u32,
    pub dict_variant: u32,
    pub keys_header: u32,
    pub keys_size: u32,
    pub keys_nentries: u32,
    pub keys_indices: u32,
    pub entry_size: u32,
    pub entry_value: u32,
    pub fixed: [Plan; FIXED_PLANS],
}

const _: () = assert!(std::mem::size_of::<Op>() == 20);
const _: () = assert!(std::mem::size_of::<Plan>() == 88);
const _: () = assert!(std::mem::size_of::<PlanKey>() == 16);
const _: () = assert!(std::mem::size_of::<TasksTarget>() == 1024);

// SAFETY: plain integers, repr(C), no padding (sizes checked above).
unsafe impl aya::Pod for Op {}
// SAFETY: as above.
unsafe impl aya::Pod for Plan {}
// SAFETY: as above.
unsafe impl aya::Pod for PlanKey {}
// SAFETY: as above.
unsafe impl aya::Pod for TasksTarget {}

fn ptr(off: u64, plan: u8) -> Op {
    Op { code: OP_PTR, plan, off: off as i32, ..Op::default() }
}

/// Bytes from the object on that cover each offset's word.
fn cover(offs: impl IntoIterator<Item = u64>) -> u32 {
    offs.into_iter().map(|o| o + 8).max().unwrap_or(16).min(u64::from(BLOCK_MAX)) as u32
}

fn plan(len: u32, ops: &[Op]) -> Plan {
    let mut p = Plan { before: 0, len, ops: [Op::default(); PLAN_OPS] };
    p.ops[..ops.len()].copy_from_slice(ops);
    p
}

/// Plans for one target, from its offsets.
pub struct Planner<'a> {
    ao: &'a AsyncioOffsets,
    o: &'a Offsets,
    names: &'a NameOffsets,
    /// Bytes of a frame the walk reads (`kernel::frame_words::FrameWords::bytes`).
    frame_bytes: u64,
    ident: IdentRule,
}

impl<'a> Planner<'a> {
    /// None when the version's objects cannot be read (no object offsets).
    pub fn new(ao: &'a AsyncioOffsets, o: &'a Offsets, frame_bytes: u64) -> Option<Planner<'a>> {
        Some(Planner { ao, o, names: o.names.as_ref()?, frame_bytes, ident: IdentRule::for_offsets(o) })
    }

    /// The target's `struct tasks_target`: `root` is the dict of running
    /// tasks (≤ 3.13; 0 where the thread state names its task).
    pub fn target(&self, root: u64) -> TasksTarget {
        let (ao, n) = (self.ao, self.names);
        let vs_tag = match ao.value_stack {
            ValueStack::StackPointer { tag_mask, .. } => tag_mask,
            _ => 0,
        };
        let (dict_variant, keys_size) = match n.keys_size {
            KeysSize::Size { dk_size } => (DICT_SIZE, dk_size),
            KeysSize::Log2 { log2_index_bytes, .. } => (DICT_LOG2, log2_index_bytes),
        };
        let mut fixed = [Plan::default(); FIXED_PLANS];
        for (i, p) in fixed.iter_mut().enumerate() {
            *p = self.fixed(i as u8 + 1);
        }
        TasksTarget {
            root,
            tag_mask: vs_tag | self.o.constants.executable_tag_mask,
            running_task: ao.thread_running_task.map_or(NO_FIELD, |o| o as u32),
            ob_type: self.o.object.ob_type as u32,
            awaited_slot: ao.awaited_slot.max(1) as u32,
            dict_variant,
            keys_header: n.keys_header_size as u32,
            keys_size: keys_size as u32,
            keys_nentries: n.dk_nentries as u32,
            keys_indices: n.dk_indices as u32,
            entry_size: n.entry.size as u32,
            entry_value: n.entry.value as u32,
            fixed,
        }
    }

    /// The fixed plan `PLAN_*` number `which`.
    fn fixed(&self, which: u8) -> Plan {
        let (ao, n, o) = (self.ao, self.names, self.o);
        match which {
            PLAN_TASK => self.future(true),
            PLAN_CORO => self.coroutine(),
            PLAN_FRAME => {
                // ≤ 3.10's frame objects: the walk's bytes, its code, and
                // what it awaits.
                let (stack, fields) = match ao.value_stack {
                    ValueStack::FrameStacktop { f_stacktop } => {
                        (Op { code: OP_STACK, variant: STACK_END, off: f_stacktop as i32, ..Op::default() }, vec![f_stacktop])
                    }
                    ValueStack::FrameDepth { f_valuestack, f_stackdepth } => (
                        Op { code: OP_STACK, variant: STACK_DEPTH, off: f_valuestack as i32, count: f_stackdepth as i32, ..Op::default() },
                        vec![f_valuestack, f_stackdepth],
                    ),
                    _ => (Op::default(), vec![]),
                };
                let len = cover(fields.into_iter().chain([self.frame_bytes - 8, o.frame.code]));
                plan(len, &[ptr(o.frame.code, PLAN_CODE), stack])
            }
            PLAN_CODE => match self.ident.kind {
                IDENT_WORD => plan(self.ident.off + self.ident.span_len, &[]),
                IDENT_NAME => plan(self.ident.off + 8, &[ptr(u64::from(self.ident.off), PLAN_NAME)]),
                _ => plan(16, &[]),
            },
            PLAN_NAME => plan(cover([u64::from(self.ident.ascii_data.max(self.ident.compact_data)), u64::from(self.ident.hash_off) + 8]), &[]),
            PLAN_LIST => plan(
                cover([ao.list_size, ao.list_items]),
                &[Op { code: OP_ARRAY, plan: PLAN_PAIR, off: ao.list_items as i32, count: ao.list_size as i32, stride: 8, max: ARRAY_MAX, ..Op::default() }],
            ),
            // The reader takes the callback only, never the context.
            PLAN_PAIR => plan(cover([ao.tuple_items]), &[ptr(ao.tuple_items, BY_TYPE)]),
            PLAN_CLOSURE => plan(
                cover([ao.tuple_size, ao.tuple_items + 8 * (u64::from(ITEMS_MAX) - 1)]),
                &[Op { code: OP_ITEMS, plan: PLAN_CELL, off: ao.tuple_items as i32, count: ao.tuple_size as i32, max: ITEMS_MAX, ..Op::default() }],
            ),
            PLAN_CELL => plan(cover([ao.cell_ref]), &[ptr(ao.cell_ref, BY_TYPE)]),
            PLAN_SET => self.set(),
            PLAN_DICT => {
                plan(cover([n.ma_keys, n.ma_values, n.dict_size - 8]), &[Op { code: OP_DICT, plan: PLAN_TASK, off: n.ma_keys as i32, ..Op::default() }])
            }
            _ => Plan::default(),
        }
    }

    fn set(&self) -> Plan {
        let ao = self.ao;
        plan(
            cover([ao.set_mask, ao.set_table]),
            &[Op {
                code: OP_ARRAY,
                plan: BY_TYPE,
                off: ao.set_table as i32,
                count: ao.set_mask as i32,
                extra: 1,
                stride: ao.setentry_size as u16,
                max: ARRAY_MAX,
                ..Op::default()
            }],
        )
    }

    /// A task (`task`) or a future: what awaits it, and a task's
    /// coroutine and name.
    fn future(&self, task: bool) -> Plan {
        let ao = self.ao;
        let mut ops = Vec::new();
        let mut fields = Vec::new();
        if task {
            ops.push(ptr(ao.task_coro, PLAN_CORO));
            ops.push(ptr(ao.task_name, BY_TYPE));
            fields.extend([ao.task_coro, ao.task_name]);
        }
        match ao.awaiter_links {
            AwaiterLinks::Callbacks => {
                for (off, plan) in [(ao.fut_callback0, BY_TYPE), (ao.fut_callbacks, PLAN_LIST)] {
                    if let Some(off) = off {
                        ops.push(ptr(off, plan));
                        fields.push(off);
                    }
                }
            }
            AwaiterLinks::AwaitedBy => {
                if let (Some(by), Some(is_set)) = (ao.task_awaited_by, ao.task_awaited_by_is_set) {
                    ops.push(Op { variant: IF_FLAG, count: is_set as i32, ..ptr(by, PLAN_SET) });
                    fields.extend([by, is_set]);
                }
            }
        }
        if task {
            fields.push(ao.task_size.saturating_sub(8).min(u64::from(BLOCK_MAX) - 8));
        }
        plan(cover(fields), &ops)
    }

    /// A coroutine: its frame (inside it from 3.11, else its frame object),
    /// the frame's code, and what it awaits.
    fn coroutine(&self) -> Plan {
        let (ao, o) = (self.ao, self.o);
        match ao.gen_frame {
            GenFrame::Pointer { gi_frame } => plan(cover([gi_frame]), &[ptr(gi_frame, PLAN_FRAME)]),
            GenFrame::Embedded { gi_iframe, gi_frame_state, .. } => {
                let frame = |off: u64| gi_iframe + off;
                let (stack, fields) = match ao.value_stack {
                    ValueStack::LocalsplusTop { localsplus, stacktop } => (
                        Op { code: OP_STACK, variant: STACK_LOCALS, off: frame(localsplus) as i32, count: frame(stacktop) as i32, ..Op::default() },
                        vec![frame(stacktop)],
                    ),
                    ValueStack::StackPointer { stackpointer, .. } => {
                        (Op { code: OP_STACK, variant: STACK_END, off: frame(stackpointer) as i32, masked: 1, ..Op::default() }, vec![frame(stackpointer)])
                    }
                    _ => (Op::default(), vec![]),
                };
                let len = cover(fields.into_iter().chain([gi_frame_state, frame(self.frame_bytes - 8), frame(o.frame.code)]));
                plan(len, &[Op { masked: 1, ..ptr(frame(o.frame.code), PLAN_CODE) }, stack])
            }
        }
    }

    /// The plan for objects of a type the graph classified as `kind`; None
    /// for kinds the graph reads nothing more of (a header is copied).
    pub fn by_kind(&self, kind: Kind) -> Option<Plan> {
        let (ao, n) = (self.ao, self.names);
        let ob = &self.o.object;
        Some(match kind {
            Kind::Task => self.future(true),
            Kind::Future => self.future(false),
            Kind::Coroutine => self.coroutine(),
            Kind::WakeupWrapper => plan(cover([ao.wakeup_wrapper_task?]), &[ptr(ao.wakeup_wrapper_task?, BY_TYPE)]),
            Kind::BuiltinMethod => plan(cover([ao.cfunction_self]), &[ptr(ao.cfunction_self, BY_TYPE)]),
            Kind::Method => plan(cover([ao.method_self]), &[ptr(ao.method_self, BY_TYPE)]),
            Kind::Function => plan(cover([ao.function_closure]), &[ptr(ao.function_closure, PLAN_CLOSURE)]),
            Kind::Set => self.set(),
            // A task's name: its characters, as many as fit.
            Kind::Str => plan(BLOCK_MAX.min((ob.unicode_ascii_size.max(ob.unicode_compact_size) + 128) as u32), &[]),
            Kind::Int => plan(cover([n.ob_digit + 16]), &[]),
            _ => return None,
        })
    }

    /// The plan for instances of a type whose attribute lies at `slot`.
    pub fn by_attr(&self, slot: AttrSlot) -> Option<Plan> {
        let ob_type = self.o.object.ob_type;
        match slot {
            AttrSlot::Inline { dict_before, item, valid, capacity } => {
                let len = cover([Some(item), valid, capacity, Some(ob_type)].into_iter().flatten());
                (item + 8 <= u64::from(BLOCK_MAX)).then(|| Plan { before: dict_before as u32, ..plan(len, &[ptr(item, BY_TYPE)]) })
            }
            AttrSlot::Values { pointer_before, dict_before, tag, array, index, capacity } => {
                // The reader reads the values' capacity byte only where
                // the version has one inside the values (3.13+, inline).
                if capacity.is_some_and(|c| c >= array) || array + 8 * (index + 1) > u64::from(BLOCK_MAX) {
                    return None;
                }
                let op = Op {
                    code: OP_VALUES,
                    plan: BY_TYPE,
                    variant: if tag != 0 { VALUES_TAGGED } else { VALUES_PTR },
                    off: -(pointer_before as i32),
                    count: index as i32,
                    key: array as u16,
                    extra: tag as u16,
                    ..Op::default()
                };
                Some(Plan { before: pointer_before.max(dict_before) as u32, ..plan(cover([ob_type]), &[op]) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plan of every version's offsets stays within a block and
    /// copies the words its ops read: a plan that reads outside its copy
    /// follows nothing (the program reads no word outside the block).
    #[test]
    fn every_plan_covers_what_it_follows() {
        for minor in 8..=13u32 {
            let o = crate::offsets::table::offsets_for_tests(minor);
            let ao = crate::offsets::asyncio::for_version(minor).expect("a file").expect("asyncio offsets");
            // The most a capture copies of a frame: every plan's lengths at their largest.
            let p = Planner::new(&ao, &o, crate::kernel::record::MAX_FRAME_BYTES).expect("planner");
            let t = p.target(0);
            let mut plans: Vec<Plan> = t.fixed.to_vec();
            for k in [
                Kind::Task,
                Kind::Future,
                Kind::Coroutine,
                Kind::WakeupWrapper,
                Kind::BuiltinMethod,
                Kind::Method,
                Kind::Function,
                Kind::Set,
                Kind::Str,
                Kind::Int,
            ] {
                plans.extend(p.by_kind(k));
            }
            for pl in plans {
                assert!(pl.before + pl.len <= BLOCK_MAX && pl.len > 0, "3.{minor}: {pl:?}");
                for op in pl.ops.iter().filter(|op| op.code != 0) {
                    let end = pl.before as i64 + op.off as i64 + 8;
                    let word_in = |at: i64| at >= 0 && at + 8 <= (pl.before + pl.len) as i64;
                    if op.code != OP_STACK || op.variant != STACK_LOCALS {
                        assert!(word_in(end - 8), "3.{minor}: op {op:?} reads outside {pl:?}");
                    }
                    if matches!(op.code, OP_ITEMS | OP_ARRAY) || (op.code == OP_STACK && op.variant != STACK_END) || op.variant == IF_FLAG {
                        assert!(word_in(pl.before as i64 + op.count as i64), "3.{minor}: count of {op:?} outside {pl:?}");
                    }
                }
            }
            assert_eq!(t.running_task, NO_FIELD, "3.{minor}: the running tasks are in a dict before 3.14");
        }
    }
}
