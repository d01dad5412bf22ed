//! One `process_vm_readv` per sample. Stacks change little between samples,
//! so the ranges one sample read (thread states, frames, code-object headers)
//! are what the next one will read. [`Prefetcher::begin`] re-reads all of them
//! in a single call, merged into few iovecs; the walk then reads through a
//! [`SampleView`], which serves what the fresh copy holds and goes to the
//! kernel only for the rest. Nothing survives from one sample to the next
//! except the *plan* of what to read, so no stale data can leak into a stack:
//! every byte a sample uses was read during that sample.
//!
//! The kernel copies iovecs strictly in array order (one loop in
//! `process_vm_rw_core`, each range's pages pinned with fully ordered atomic
//! operations), so the order of a plan is the order in time. It has three
//! phases: [`Phase::Code`] (code objects and their strings), then
//! [`Phase::Stack`] (thread states, frames), then the tail words (counters
//! read after every frame, see [`Prefetcher::set_tail`]). Code objects go
//! first so that the stack comes last before the walk and its re-read: the
//! shorter the time from a thread's current-frame pointer to the re-read,
//! the fewer snapshots a moving stack tears (reading them after the stack
//! tore a 3.12 target's deep stack five times as often).

use std::cell::{Cell, RefCell};

use crate::counts::Counters;
use crate::error::Result;
use crate::process::memory::{RemoteMemory, field_u64};

/// Ranges closer than this are read as one (the bytes between are cheap;
/// iovec count and syscalls are not). Also the growth room left on each side
/// of a range, so a stack that grows by a frame still hits. Growth never
/// leaves the pages the original read touched, and a gap under one page
/// cannot hide a whole unmapped page: so a plan never faults on memory that
/// was mapped when it was made (one fault would void every later range).
const MERGE_GAP: u64 = 512;
const PAGE: u64 = 4096;

/// Whether a range starting at `start` lies on the page where one ending at
/// `end` (exclusive) ends, or the next: read as one, they add no page that
/// neither touches, so none that may be unmapped.
pub fn on_next_page(end: u64, start: u64) -> bool {
    start / PAGE <= (end - 1) / PAGE + 1
}
/// A plan is capped so a pathological sample cannot make every later one huge.
const MAX_PLAN_BYTES: u64 = 4 << 20;
const MAX_PLAN_RANGES: usize = 4096;
/// A range stays in the plan this many samples after the last one that read
/// it: a program alternating between a few stacks (a loop calling a short
/// function, sampled sometimes inside it and sometimes not) then finds each
/// one's frames and code already read, instead of paying a syscall per miss.
const PLAN_KEEP_SAMPLES: u8 = 4;

/// Which part of a sample's read a range belongs to, in the order read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Code = 0,
    Stack = 1,
}

/// When bytes were copied out of the target: 4 × the reader's syscall count
/// after the call that copied them, plus the phase within a sample's first
/// call (code 0, stack 1, tail 2). Every read of a session is thus ordered,
/// and a later call is later than every phase of an earlier one.
pub fn read_time(syscalls: u64, phase: u64) -> u64 {
    syscalls * 4 + phase
}
const TAIL_PHASE: u64 = 2;

/// One phase's ranges held this sample: (start, end, offset in `data`,
/// read time), sorted.
type Held = Vec<(u64, u64, usize, u64)>;
/// A plan: (start, end, samples since a sample last read inside it), sorted, disjoint.
type Plan = Vec<(u64, u64, u8)>;

#[derive(Default)]
struct State {
    held: [Held; 2],
    data: Vec<u8>,
    /// Ranges this sample asked for, per phase, for the next plan.
    seen: [Vec<(u64, u64)>; 2],
    /// (phase, index in that phase's plan) of the range at which this
    /// sample's read faulted (the target unmapped it): it is left out of the
    /// next plan.
    fault: Option<(usize, usize)>,
    hits: u64,
    misses: u64,
    /// (address, value) of the tail words this sample's first call read.
    tail: Vec<(u64, u64)>,
    /// The latest value read of each tail word before this sample began.
    tail_before: Vec<(u64, u64)>,
    /// (address, value) of the `last` words of this sample's first call.
    last: Vec<(u64, u64)>,
}

/// One phase's plan as the iovecs that read it: ranges on the same or
/// neighbouring pages become one. The kernel pins and looks up each remote
/// iovec on its own, which costs more than copying the rest of a page (one
/// call reading 8 ranges on one page costs as much as 8 on 8 pages), and
/// the bytes between lie on pages a range of the plan was read from, so a
/// merge adds no page that could be unmapped.
fn coalesce(plan: &Plan, phase: usize, out: &mut Vec<(u64, u64, usize)>) {
    let first = out.len();
    for &(s, e, _) in plan {
        match out[first..].last_mut() {
            Some(last) if on_next_page(last.1, s) => last.1 = last.1.max(e),
            _ => out.push((s, e, phase)),
        }
    }
}

#[derive(Default)]
pub struct Prefetcher {
    state: RefCell<State>,
    /// Words read after every plan range, in the same call (see
    /// [`Prefetcher::set_tail`]).
    tail: Vec<u64>,
    plans: [Plan; 2],
    /// Scratch for building the next plan.
    next: Plan,
    /// This sample's first call: (start, end, phase), see [`coalesce`].
    iovs: Vec<(u64, u64, usize)>,
    /// The same as (address, length), with the tail words after them.
    ranges: Vec<(u64, usize)>,
    /// The reader's syscall count after this sample's first call.
    first_call: Cell<u64>,
}

impl Prefetcher {
    /// Read this sample's plan in one call. Ranges the target no longer maps are
    /// simply not served (reads there go to the kernel and fail normally).
    /// `last` words are read at the very end of that call (see
    /// [`Self::last_words`]).
    pub fn begin(&mut self, mem: &dyn RemoteMemory, last: &[u64]) {
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        st.seen.iter_mut().for_each(Vec::clear);
        st.held.iter_mut().for_each(Vec::clear);
        st.fault = None;
        st.last.clear();
        for (a, v) in st.tail.drain(..) {
            match st.tail_before.iter_mut().find(|w| w.0 == a) {
                Some(w) => w.1 = v,
                None => st.tail_before.push((a, v)),
            }
        }
        self.iovs.clear();
        for (p, plan) in self.plans.iter().enumerate() {
            coalesce(plan, p, &mut self.iovs);
        }
        let tail_at = self.iovs.iter().map(|&(s, e, _)| (e - s) as usize).sum::<usize>();
        st.data.resize(tail_at + 8 * (self.tail.len() + last.len()), 0);
        if st.data.is_empty() {
            self.first_call.set(mem.calls());
            return;
        }
        self.ranges.clear();
        self.ranges.extend(self.iovs.iter().map(|&(s, e, _)| (s, (e - s) as usize)).chain(self.tail.iter().chain(last).map(|&a| (a, 8))));
        let got = mem.read_scatter(&self.ranges, &mut st.data);
        // Ranges arrive in order up to the first fault: keep the ones that
        // arrived whole.
        let (mut off, mut left, call) = (0usize, got, mem.calls());
        for &(s, e, p) in &self.iovs {
            let len = (e - s) as usize;
            if left < len {
                // The plan range holding the first byte that did not arrive.
                let at = s + left as u64;
                st.fault = Some((p, self.plans[p].partition_point(|r| r.1 <= at)));
                break;
            }
            st.held[p].push((s, e, off, read_time(call, p as u64)));
            off += len;
            left -= len;
        }
        self.first_call.set(call);
        if st.fault.is_none() {
            let words = (left / 8).min(self.tail.len());
            st.tail.extend(self.tail[..words].iter().enumerate().map(|(i, &a)| (a, field_u64(&st.data, tail_at + 8 * i))));
            if left / 8 == self.tail.len() + last.len() {
                let at = tail_at + 8 * self.tail.len();
                st.last.extend(last.iter().enumerate().map(|(i, &a)| (a, field_u64(&st.data, at + 8 * i))));
            }
        }
        st.data.truncate(tail_at);
    }

    /// Words to read at the very end of each following sample's first call,
    /// after everything the plan holds: a counter read there is known to have
    /// been read after every frame that call copied (see [`Self::tail_word`]).
    /// Repeated words are read once.
    pub fn set_tail(&mut self, words: impl Iterator<Item = u64>) {
        self.tail.clear();
        for w in words {
            if !self.tail.contains(&w) {
                self.tail.push(w);
            }
        }
    }

    /// The value of tail word `addr` read by this sample's first call, after
    /// all of the plan; None if it was not read whole.
    pub fn tail_word(&self, addr: u64) -> Option<u64> {
        self.state.borrow().tail.iter().find(|w| w.0 == addr).map(|w| w.1)
    }

    /// The `last` words of [`Self::begin`] as its call read them, after
    /// everything else in it; empty if they did not arrive. They are the last
    /// bytes of the sample read if nothing was read after that call
    /// ([`Self::read_after_first_call`]).
    pub fn last_words(&self) -> std::cell::Ref<'_, [(u64, u64)]> {
        std::cell::Ref::map(self.state.borrow(), |st| st.last.as_slice())
    }

    /// Whether anything was read from `mem` since this sample's first call.
    pub fn read_after_first_call(&self, mem: &dyn RemoteMemory) -> bool {
        mem.calls() != self.first_call.get()
    }

    /// When this sample's first call read its tail words.
    pub fn tail_time(&self) -> u64 {
        read_time(self.first_call.get(), TAIL_PHASE)
    }

    /// The latest value of tail word `addr` read before this sample began:
    /// older than every byte this sample reads.
    pub fn tail_word_before(&self, addr: u64) -> Option<u64> {
        self.state.borrow().tail_before.iter().find(|w| w.0 == addr).map(|w| w.1)
    }

    /// Read one more stack range now and serve it for the rest of this
    /// sample, for what is known to be needed before the walk asks (a
    /// thread's frame chunk). Best effort: a range that faults or overlaps
    /// one already held is simply not added.
    pub fn load(&self, mem: &dyn RemoteMemory, addr: u64, len: usize) {
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        let held = &mut st.held[Phase::Stack as usize];
        let end = addr.saturating_add(len as u64);
        let i = held.partition_point(|r| r.0 < addr);
        let overlaps_prev = i > 0 && held[i - 1].1 > addr;
        let overlaps_next = i < held.len() && held[i].0 < end;
        if overlaps_prev || overlaps_next {
            return;
        }
        let off = st.data.len();
        st.data.resize(off + len, 0);
        let got = mem.read_scatter(&[(addr, len)], &mut st.data[off..]);
        if got != len {
            st.data.truncate(off);
            return;
        }
        held.insert(i, (addr, end, off, read_time(mem.calls(), Phase::Stack as u64)));
    }

    /// Turn what this sample read, and what the last few read, into the
    /// next sample's plan.
    pub fn end(&mut self) {
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        for p in 0..2 {
            let seen = &mut st.seen[p];
            seen.sort_unstable();
            // This sample's ranges, each grown within its own pages (age 0), and
            // the current plan's ranges one sample older, merged in one pass: both
            // lists are sorted by start.
            let fresh = seen.iter().map(|&(s, e)| {
                let lo = s & !(PAGE - 1);
                let hi = (e.saturating_sub(1) | (PAGE - 1)).saturating_add(1);
                (s.saturating_sub(MERGE_GAP / 2).max(lo), e.saturating_add(MERGE_GAP / 2).min(hi), 0u8)
            });
            let fault = st.fault;
            let old = self.plans[p]
                .iter()
                .enumerate()
                .filter(|&(i, r)| fault != Some((p, i)) && r.2 + 1 < PLAN_KEEP_SAMPLES)
                .map(|(_, &(s, e, age))| (s, e, age + 1));
            let next = &mut self.next;
            next.clear();
            let mut push = |r: (u64, u64, u8)| match next.last_mut() {
                Some(last) if r.0 <= last.1 + MERGE_GAP => {
                    last.1 = last.1.max(r.1);
                    last.2 = last.2.min(r.2);
                }
                _ => next.push(r),
            };
            let (mut a, mut b) = (fresh.peekable(), old.peekable());
            loop {
                let take_a = match (a.peek(), b.peek()) {
                    (Some(x), Some(y)) => x.0 <= y.0,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                push(if take_a { a.next() } else { b.next() }.unwrap());
            }
            let mut bytes = 0;
            next.retain(|&(s, e, _)| {
                bytes += e - s;
                bytes <= MAX_PLAN_BYTES
            });
            next.truncate(MAX_PLAN_RANGES);
            std::mem::swap(&mut self.plans[p], &mut self.next);
            seen.clear();
        }
    }

    /// Plan nothing for the next sample: what the last ones read is not
    /// what it will (a full walk followed by walks of one thread).
    pub fn forget_plan(&mut self) {
        self.plans.iter_mut().for_each(Vec::clear);
    }

    /// The view the walk reads thread states and frames through.
    pub fn view<'a>(&'a self, mem: &'a dyn RemoteMemory) -> SampleView<'a> {
        SampleView { pf: self, mem, phase: Phase::Stack, fresh: false }
    }

    /// Hits and misses since the last call, handed over.
    pub fn take_counts(&self) -> Counters {
        let mut st = self.state.borrow_mut();
        Counters { prefetch_hits: std::mem::take(&mut st.hits), prefetch_misses: std::mem::take(&mut st.misses), ..Counters::default() }
    }
}

/// Remote memory as seen during one sample, for one phase.
#[derive(Clone, Copy)]
pub struct SampleView<'a> {
    pf: &'a Prefetcher,
    mem: &'a dyn RemoteMemory,
    phase: Phase,
    /// Go to the kernel for every read (still planning what was read).
    fresh: bool,
}

impl<'a> SampleView<'a> {
    /// The same sample seen by the code cache: served from the code phase.
    /// `fresh`: serve nothing from the first call (reads in program order).
    pub fn code(&self, fresh: bool) -> SampleView<'a> {
        SampleView { phase: Phase::Code, fresh, ..*self }
    }

    /// Note a range this sample read, for the next plan. Walks read
    /// neighbouring words one after another (a frame chunk, innermost frame
    /// first): a read is folded into the last one when nothing unmapped can
    /// lie between, so `end` has little to sort.
    fn saw(seen: &mut Vec<(u64, u64)>, addr: u64, end: u64) {
        match seen.last_mut() {
            Some(last) if addr <= last.1 + MERGE_GAP && end + MERGE_GAP >= last.0 => {
                last.0 = last.0.min(addr);
                last.1 = last.1.max(end);
            }
            _ => seen.push((addr, end)),
        }
    }

    /// The held range of this phase covering `addr..end`.
    fn held(st: &State, phase: Phase, addr: u64, end: u64) -> Option<(u64, u64, usize, u64)> {
        let held = &st.held[phase as usize];
        // Ranges are sorted and disjoint: binary search the one starting at or before addr.
        let i = held.partition_point(|r| r.0 <= addr);
        (i > 0 && end <= held[i - 1].1).then(|| held[i - 1])
    }
}

impl RemoteMemory for SampleView<'_> {
    fn read_time(&self, addr: u64, len: usize) -> (u64, Option<(u64, u64)>) {
        let st = self.pf.state.borrow();
        match Self::held(&st, self.phase, addr, addr.saturating_add(len as u64)) {
            Some((s, e, _, t)) if !self.fresh => (t, Some((s, e))),
            // Not held: read from the kernel just now, by the last call made.
            _ => (read_time(self.mem.calls(), 0), None),
        }
    }

    /// Fresh: one call for all of them, in order (the kernel copies iovecs in
    /// array order, so a later request is read after an earlier one).
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        if !self.fresh {
            return reqs.iter_mut().try_for_each(|(a, b)| self.read(*a, b));
        }
        self.mem.read_many(reqs)?;
        let mut st = self.pf.state.borrow_mut();
        for (a, b) in reqs.iter() {
            Self::saw(&mut st.seen[self.phase as usize], *a, a + b.len() as u64);
        }
        Ok(())
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let end = addr.saturating_add(buf.len() as u64);
        let p = self.phase as usize;
        if !self.fresh {
            let mut st = self.pf.state.borrow_mut();
            let st = &mut *st;
            if let Some((s, _, off, _)) = Self::held(st, self.phase, addr, end) {
                let from = off + (addr - s) as usize;
                buf.copy_from_slice(&st.data[from..from + buf.len()]);
                st.hits += 1;
                Self::saw(&mut st.seen[p], addr, end);
                return Ok(());
            }
            st.misses += 1;
        }
        // Only memory that could be read goes into the plan: one unmapped
        // range there would void every range after it in the next sample.
        self.mem.read(addr, buf)?;
        Self::saw(&mut self.pf.state.borrow_mut().seen[p], addr, end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::memory::VmReader;

    /// One sample: begin, read each address (8 bytes) through the view, end.
    /// Returns the values read and whether each read was a hit.
    fn sample(pf: &mut Prefetcher, mem: &dyn RemoteMemory, addrs: &[u64]) -> Vec<(u64, bool)> {
        pf.begin(mem, &[]);
        let out = addrs
            .iter()
            .map(|&a| {
                pf.take_counts();
                let v = pf.view(mem).read_u64(a).unwrap();
                (v, pf.take_counts().prefetch_hits > 0)
            })
            .collect();
        pf.end();
        out
    }

    /// Ranges share an iovec when no page lies between them that neither
    /// touches: such a page may be unmapped, and a fault voids the call's rest.
    #[test]
    fn coalesce_joins_ranges_on_the_same_or_next_page_only() {
        let plan: Plan = vec![(0x1010, 0x1020, 0), (0x1f00, 0x1f10, 2), (0x2ff0, 0x3008, 0), (0x4000, 0x4010, 1), (0x6000, 0x6008, 0)];
        let mut out = vec![(0x10, 0x20, 0)];
        coalesce(&plan, 1, &mut out);
        // Another phase's iovec before them is left alone.
        assert_eq!(out, vec![(0x10, 0x20, 0), (0x1010, 0x4010, 1), (0x6000, 0x6008, 1)]);
    }

    /// Against this process's own memory: a range read by one sample is
    /// served to the next few from the single plan read, then dropped; and
    /// what is served is always what memory holds now, never an old copy.
    #[test]
    fn plan_keeps_recent_ranges_and_serves_fresh_bytes() {
        // Two words a page apart, each in its own allocation, so they land in
        // separate plan ranges.
        let a = Box::new([0u64; 1024]);
        let b = Box::new([0u64; 1024]);
        let (pa, pb) = (&a[0] as *const u64 as u64, &b[512] as *const u64 as u64);
        let mem = VmReader::new(std::process::id() as i32);
        let mut pf = Prefetcher::default();
        assert_eq!(sample(&mut pf, &mem, &[pa, pb]), vec![(0, false), (0, false)], "nothing planned yet");
        assert_eq!(sample(&mut pf, &mem, &[pa, pb]), vec![(0, true), (0, true)]);
        // Samples that skip b still keep it planned for a while...
        for _ in 1..PLAN_KEEP_SAMPLES {
            assert_eq!(sample(&mut pf, &mem, &[pa]), vec![(0, true)]);
        }
        let mut b = b;
        b[512] = 7;
        assert_eq!(sample(&mut pf, &mem, &[pb]), vec![(7, true)], "kept, and read afresh");
        for _ in 0..PLAN_KEEP_SAMPLES {
            sample(&mut pf, &mem, &[pa]);
        }
        assert_eq!(sample(&mut pf, &mem, &[pb]), vec![(7, false)], "aged out");
    }
}
