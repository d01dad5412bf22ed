//! One `process_vm_readv` per sample. Stacks change little between samples,
//! so the ranges one sample read (thread states, frames, code-object headers)
//! are what the next one will read. [`Prefetcher::begin`] re-reads all of them
//! in a single call, merged into few iovecs; the walk then reads through a
//! [`SampleView`], which serves what the fresh copy holds and goes to the
//! kernel only for the rest. Nothing survives from one sample to the next
//! except the *plan* of what to read, so no stale data can leak into a stack:
//! every byte a sample uses was read during that sample.

use std::cell::RefCell;

use crate::error::Result;
use crate::process::memory::{RemoteMemory, VmReader};

/// Ranges closer than this are read as one (the bytes between are cheap;
/// iovec count and syscalls are not). Also the growth room left on each side
/// of a range, so a stack that grows by a frame still hits. Growth never
/// leaves the pages the original read touched, and a gap under one page
/// cannot hide a whole unmapped page: so a plan never faults on memory that
/// was mapped when it was made (one fault would void every later range).
const MERGE_GAP: u64 = 512;
const PAGE: u64 = 4096;
/// A plan is capped so a pathological sample cannot make every later one huge.
const MAX_PLAN_BYTES: u64 = 4 << 20;
const MAX_PLAN_RANGES: usize = 512;
/// A range stays in the plan this many samples after the last one that read
/// it: a program alternating between a few stacks (a loop calling a short
/// function, sampled sometimes inside it and sometimes not) then finds each
/// one's frames and code already read, instead of paying a syscall per miss.
const PLAN_KEEP_SAMPLES: u8 = 4;

#[derive(Default)]
struct State {
    /// Merged ranges read at the start of this sample: (start, end, offset in `data`).
    ranges: Vec<(u64, u64, usize)>,
    data: Vec<u8>,
    /// Ranges this sample asked for, for the next plan.
    seen: Vec<(u64, u64)>,
    /// Index in the plan of the range at which this sample's read faulted
    /// (the target unmapped it): it is left out of the next plan.
    fault: Option<usize>,
    hits: u64,
    misses: u64,
}

#[derive(Default)]
pub struct Prefetcher {
    state: RefCell<State>,
    /// (start, end, samples since a sample last read inside it), sorted, disjoint.
    plan: Vec<(u64, u64, u8)>,
    /// Scratch for building the next plan.
    next: Vec<(u64, u64, u8)>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct PrefetchStats {
    pub hits: u64,
    pub misses: u64,
}

impl Prefetcher {
    /// Read this sample's plan in one call. Ranges the target no longer maps are
    /// simply not served (reads there go to the kernel and fail normally).
    pub fn begin(&mut self, mem: &VmReader) {
        let mut st = self.state.borrow_mut();
        st.seen.clear();
        st.ranges.clear();
        st.fault = None;
        let total: u64 = self.plan.iter().map(|(s, e, _)| e - s).sum();
        st.data.resize(total as usize, 0);
        if self.plan.is_empty() {
            return;
        }
        let st = &mut *st;
        let base = st.data.as_mut_ptr();
        let mut next = 0usize;
        let ranges = self.plan.iter().map(|&(s, e, _)| {
            let len = (e - s) as usize;
            // SAFETY: `data` was sized to the plan's total above, so each
            // destination lies inside it, and consecutive ones do not overlap.
            let dst = unsafe { base.add(next) };
            next += len;
            (s, dst, len)
        });
        // SAFETY: see the closure; `data` is not touched until the call returns.
        let got = unsafe { mem.read_ranges(ranges) };
        let mut off = 0usize;
        // process_vm_readv fills iovecs in order and stops at the first fault:
        // keep the ranges that arrived whole.
        let mut left = got;
        for (i, &(s, e, _)) in self.plan.iter().enumerate() {
            let len = (e - s) as usize;
            if left < len {
                st.fault = Some(i);
                break;
            }
            st.ranges.push((s, e, off));
            off += len;
            left -= len;
        }
    }

    /// Read one more range now and serve it for the rest of this sample, for
    /// what is known to be needed before the walk asks (a thread's frame
    /// chunk). Best effort: a range that faults or overlaps one already held
    /// is simply not added.
    pub fn load(&self, mem: &VmReader, addr: u64, len: usize) {
        let mut st = self.state.borrow_mut();
        let end = addr.saturating_add(len as u64);
        let i = st.ranges.partition_point(|r| r.0 < addr);
        let overlaps_prev = i > 0 && st.ranges[i - 1].1 > addr;
        let overlaps_next = i < st.ranges.len() && st.ranges[i].0 < end;
        if overlaps_prev || overlaps_next {
            return;
        }
        let off = st.data.len();
        st.data.resize(off + len, 0);
        let got = mem.read_partial(&mut [(addr, &mut st.data[off..])]);
        if got != len {
            st.data.truncate(off);
            return;
        }
        st.ranges.insert(i, (addr, end, off));
    }

    /// Turn what this sample read, and what the last few read, into the
    /// next sample's plan.
    pub fn end(&mut self) {
        let mut st = self.state.borrow_mut();
        let mut seen = std::mem::take(&mut st.seen);
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
        let old = self.plan.iter().enumerate().filter(|&(i, r)| Some(i) != fault && r.2 + 1 < PLAN_KEEP_SAMPLES).map(|(_, &(s, e, age))| (s, e, age + 1));
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
        std::mem::swap(&mut self.plan, &mut self.next);
        seen.clear();
        st.seen = seen;
    }

    pub fn view<'a>(&'a self, mem: &'a VmReader) -> SampleView<'a> {
        SampleView { pf: self, mem }
    }

    pub fn stats(&self) -> PrefetchStats {
        let st = self.state.borrow();
        PrefetchStats { hits: st.hits, misses: st.misses }
    }
}

/// Remote memory as seen during one sample.
pub struct SampleView<'a> {
    pf: &'a Prefetcher,
    mem: &'a VmReader,
}

impl SampleView<'_> {
    /// Note a range this sample read, for the next plan. Walks read
    /// neighbouring words one after another (a frame chunk, innermost frame
    /// first): a read is folded into the last one when nothing unmapped can
    /// lie between, so `end` has little to sort.
    fn saw(st: &mut State, addr: u64, end: u64) {
        match st.seen.last_mut() {
            Some(last) if addr <= last.1 + MERGE_GAP && end + MERGE_GAP >= last.0 => {
                last.0 = last.0.min(addr);
                last.1 = last.1.max(end);
            }
            _ => st.seen.push((addr, end)),
        }
    }
}

impl RemoteMemory for SampleView<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let end = addr.saturating_add(buf.len() as u64);
        {
            let mut st = self.pf.state.borrow_mut();
            // Ranges are sorted and disjoint: binary search the one starting at or before addr.
            let i = st.ranges.partition_point(|r| r.0 <= addr);
            if i > 0 {
                let (s, e, off) = st.ranges[i - 1];
                if end <= e {
                    let from = off + (addr - s) as usize;
                    buf.copy_from_slice(&st.data[from..from + buf.len()]);
                    st.hits += 1;
                    Self::saw(&mut st, addr, end);
                    return Ok(());
                }
            }
            st.misses += 1;
        }
        // Only memory that could be read goes into the plan: one unmapped
        // range there would void every range after it in the next sample.
        self.mem.read(addr, buf)?;
        Self::saw(&mut self.pf.state.borrow_mut(), addr, end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One sample: begin, read each address (8 bytes) through the view, end.
    /// Returns the values read and whether each read was a hit.
    fn sample(pf: &mut Prefetcher, mem: &VmReader, addrs: &[u64]) -> Vec<(u64, bool)> {
        pf.begin(mem);
        let out = addrs
            .iter()
            .map(|&a| {
                let before = pf.stats().hits;
                let v = pf.view(mem).read_u64(a).unwrap();
                (v, pf.stats().hits > before)
            })
            .collect();
        pf.end();
        out
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
