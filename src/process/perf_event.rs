//! The kernel's perf-event interface as pyprof uses it: opening a software
//! event that records context switches, mapping its ring buffer, and
//! reading the records out of it. Both trackers of who is on a CPU
//! ([`super::run_states`], one process's threads; [`super::occupancy`],
//! every task of every CPU) are built on this; neither declares any of it.
//!
//! The ABI (`perf_event_attr`, its flag bits, the ring's control page, the
//! ioctls) comes from `perf-event-open-sys`: declarations generated from the
//! kernel's own header, not copied by hand.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use perf_event_open_sys::bindings as sys;

/// Data pages per ring (a power of two). A switch record is 24 bytes, so
/// 256 KiB holds about 10,000 switches per CPU between two polls.
const RING_PAGES: usize = 64;

const PERF_RECORD_LOST: u32 = sys::PERF_RECORD_LOST;
const PERF_RECORD_EXIT: u32 = sys::PERF_RECORD_EXIT;
const PERF_RECORD_SWITCH: u32 = sys::PERF_RECORD_SWITCH;
const PERF_RECORD_SWITCH_CPU_WIDE: u32 = sys::PERF_RECORD_SWITCH_CPU_WIDE;
const PERF_RECORD_MISC_SWITCH_OUT: u16 = sys::PERF_RECORD_MISC_SWITCH_OUT as u16;
const PERF_RECORD_MISC_SWITCH_OUT_PREEMPT: u16 = sys::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT as u16;

/// Offsets in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = std::mem::offset_of!(sys::perf_event_mmap_page, data_head);
const DATA_TAIL: usize = std::mem::offset_of!(sys::perf_event_mmap_page, data_tail);
const DATA_OFFSET: usize = std::mem::offset_of!(sys::perf_event_mmap_page, data_offset);
const DATA_SIZE: usize = std::mem::offset_of!(sys::perf_event_mmap_page, data_size);

/// The ring of one CPU, with the event that owns it.
pub(crate) struct Ring {
    base: NonNull<u8>,
    len: usize,
    data_offset: usize,
    data_size: usize,
    fd: OwnedFd,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base and len are the mapping made in `Ring::map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

impl Ring {
    pub(crate) fn map(fd: OwnedFd) -> std::io::Result<Ring> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = page * (1 + RING_PAGES);
        // SAFETY: a fresh shared mapping of the event's ring; the kernel checks fd and len.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("null mapping"))?;
        let mut ring = Ring { base, len, data_offset: page, data_size: page * RING_PAGES, fd };
        // Kernels since 4.1 say where the data is; older ones put it after the first page.
        let (off, size) = (ring.word(DATA_OFFSET).load(Ordering::Relaxed) as usize, ring.word(DATA_SIZE).load(Ordering::Relaxed) as usize);
        if size != 0 && off.checked_add(size).is_some_and(|end| end <= len) && size.is_power_of_two() {
            (ring.data_offset, ring.data_size) = (off, size);
        }
        Ok(ring)
    }

    /// Have event `fd` write its records into this ring
    /// (PERF_EVENT_IOC_SET_OUTPUT): the event must be on the same CPU.
    pub(crate) fn send_here(&self, fd: &OwnedFd) -> std::io::Result<()> {
        // SAFETY: both are open perf event descriptors of ours.
        if unsafe { perf_event_open_sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), self.fd.as_raw_fd() as _) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the control page is mapped, 8-aligned words at fixed offsets
        // that the kernel also reads and writes atomically.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// Hand every record written since the last call to `f`, then give
    /// their room back to the kernel. False when a record that cannot be
    /// cut the batch short (the rest is dropped: as good as lost).
    pub(crate) fn take_new(&self, scratch: &mut Vec<u8>, f: impl FnMut(&[u8])) -> bool {
        // Acquire: the records before head are complete once head is seen.
        let head = self.word(DATA_HEAD).load(Ordering::Acquire);
        let tail = self.word(DATA_TAIL).load(Ordering::Relaxed);
        let end = drain(self.data(), tail, head, scratch, f);
        // Release: the kernel may overwrite what was read only after the reads.
        self.word(DATA_TAIL).store(head, Ordering::Release);
        end == head
    }

    fn data(&self) -> &[u8] {
        // SAFETY: the data area lies inside the mapping (checked in `map`).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.data_offset), self.data_size) }
    }
}

/// Whether every switch record is stamped with CLOCK_MONOTONIC (a kernel
/// that refuses `use_clockid` stamps them with its own clock, and then no
/// switch can be placed after a read: `run_states::ran_only_after` says no).
static MONOTONIC_STAMPS: AtomicBool = AtomicBool::new(true);

/// Whether the records are stamped with CLOCK_MONOTONIC (see [`open_event`]).
pub(crate) fn monotonic_stamps() -> bool {
    MONOTONIC_STAMPS.load(Ordering::Relaxed)
}

/// `tid` = -1: every task on `cpu`.
pub(crate) fn open_event(tid: i32, cpu: i32) -> std::io::Result<OwnedFd> {
    match open_event_with(tid, cpu, true) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            MONOTONIC_STAMPS.store(false, Ordering::Relaxed);
            open_event_with(tid, cpu, false)
        }
        r => r,
    }
}

fn open_event_with(tid: i32, cpu: i32, monotonic: bool) -> std::io::Result<OwnedFd> {
    let mut attr = sys::perf_event_attr {
        type_: sys::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<sys::perf_event_attr>() as u32,
        config: sys::PERF_COUNT_SW_DUMMY as u64,
        sample_type: (sys::PERF_SAMPLE_TID | sys::PERF_SAMPLE_TIME) as u64,
        // The clock `clock_gettime` reads, so that a switch can be placed
        // before or after a read of ours (`run_states::ran_only_after`).
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    attr.set_task(1);
    attr.set_sample_id_all(1);
    attr.set_context_switch(1);
    attr.set_use_clockid(u64::from(monotonic));
    // SAFETY: attr is a valid perf_event_attr of the size it states.
    let fd = unsafe { perf_event_open_sys::perf_event_open(&mut attr, tid, cpu, -1, sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The CPUs a thread may run on: /sys's online list, else 0..N.
pub(crate) fn online_cpus() -> Vec<i32> {
    if let Some(cpus) = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|s| parse_cpu_list(s.trim())) {
        return cpus;
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1);
    (0..n as i32).collect()
}

/// "0-3,8,10-11" → [0, 1, 2, 3, 8, 10, 11]; None if malformed or empty.
fn parse_cpu_list(s: &str) -> Option<Vec<i32>> {
    let mut cpus = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (i32, i32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[derive(Debug, PartialEq)]
pub(crate) enum Record {
    /// `out`: a switch-out; `on_cpu`: running or runnable after it.
    /// `other`: a CPU-wide switch names the other task too (the one
    /// switching in after a switch-out, out before a switch-in; 0 is idle).
    Switch {
        pid: i32,
        tid: i32,
        time: u64,
        on_cpu: bool,
        out: bool,
        other: Option<i32>,
    },
    Exit {
        pid: i32,
        tid: i32,
    },
    Lost {
        count: u64,
    },
}

impl Record {
    /// Whether a record concerns process `pid` (a loss may).
    pub(crate) fn is_of(&self, pid: i32) -> bool {
        match *self {
            Record::Switch { pid: p, .. } | Record::Exit { pid: p, .. } => p == pid,
            Record::Lost { .. } => true,
        }
    }
}

/// Hand each whole record between `tail` and `head` (positions that only
/// grow; the ring holds them modulo its size) to `f`, copying one that
/// wraps around the end into `scratch`. Returns how far it got: `head`, or
/// short of it at a record that cannot be (size 0 or past `head`).
pub(crate) fn drain(data: &[u8], mut tail: u64, head: u64, scratch: &mut Vec<u8>, mut f: impl FnMut(&[u8])) -> u64 {
    let size = data.len() as u64;
    if size == 0 || head.wrapping_sub(tail) > size {
        return tail;
    }
    while tail < head {
        let at = (tail % size) as usize;
        let byte = |i: usize| data[(at + i) % data.len()];
        let len = u16::from_le_bytes([byte(6), byte(7)]) as u64;
        if len < 8 || tail + len > head {
            break;
        }
        let len = len as usize;
        if at + len <= data.len() {
            f(&data[at..at + len]);
        } else {
            scratch.clear();
            scratch.extend_from_slice(&data[at..]);
            scratch.extend_from_slice(&data[..len - (data.len() - at)]);
            f(scratch);
        }
        tail += len as u64;
    }
    tail
}

/// One record, as far as run states go; None for the kinds not asked for
/// or a record too short for its kind.
pub(crate) fn parse(rec: &[u8]) -> Option<Record> {
    let u32_at = |i: usize| rec.get(i..i + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()));
    let u64_at = |i: usize| rec.get(i..i + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
    let kind = u32_at(0)?;
    let misc = u16::from_ne_bytes([*rec.get(4)?, *rec.get(5)?]);
    match kind {
        // A CPU-wide switch adds {next_prev_pid, next_prev_tid}: the other
        // task of the switch.
        PERF_RECORD_SWITCH | PERF_RECORD_SWITCH_CPU_WIDE => {
            // sample_id_all puts {pid, tid} then {time} at the end: the
            // task switching, in both kinds.
            let n = rec.len().checked_sub(16).filter(|&n| n >= if kind == PERF_RECORD_SWITCH { 8 } else { 16 })?;
            let pid = u32_at(n)? as i32;
            let tid = u32_at(n + 4)? as i32;
            let time = u64_at(n + 8)?;
            let out = misc & PERF_RECORD_MISC_SWITCH_OUT != 0;
            let other = if kind == PERF_RECORD_SWITCH_CPU_WIDE { Some(u32_at(12)? as i32) } else { None };
            Some(Record::Switch { pid, tid, time, on_cpu: !out || misc & PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0, out, other })
        }
        // {pid, ppid, tid, ptid, time}, then the sample id.
        PERF_RECORD_EXIT => Some(Record::Exit { pid: u32_at(8)? as i32, tid: u32_at(16)? as i32 }),
        // {id, lost}, then the sample id.
        PERF_RECORD_LOST => Some(Record::Lost { count: u64_at(16)? }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn switch(tid: u32, time: u64, misc: u16) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&PERF_RECORD_SWITCH.to_ne_bytes());
        r.extend_from_slice(&misc.to_ne_bytes());
        r.extend_from_slice(&24u16.to_ne_bytes());
        r.extend_from_slice(&7u32.to_ne_bytes());
        r.extend_from_slice(&tid.to_ne_bytes());
        r.extend_from_slice(&time.to_ne_bytes());
        r
    }

    #[test]
    fn parses_switches_exits_and_losses() {
        assert_eq!(parse(&switch(9, 5, 0)), Some(Record::Switch { pid: 7, tid: 9, time: 5, on_cpu: true, out: false, other: None }));
        assert_eq!(parse(&switch(9, 6, 0x2000)), Some(Record::Switch { pid: 7, tid: 9, time: 6, on_cpu: false, out: true, other: None }));
        assert_eq!(parse(&switch(9, 7, 0x6000)), Some(Record::Switch { pid: 7, tid: 9, time: 7, on_cpu: true, out: true, other: None }));
        assert_eq!(parse(&switch(9, 7, 0)[..12]), None);
        // CPU-wide: the other task of the switch comes first, then the same sample id.
        let mut wide = switch(9, 8, 0x2000);
        wide[0..4].copy_from_slice(&PERF_RECORD_SWITCH_CPU_WIDE.to_ne_bytes());
        wide[6..8].copy_from_slice(&32u16.to_ne_bytes());
        wide.splice(8..8, [3u32, 4u32].iter().flat_map(|v| v.to_ne_bytes()));
        assert_eq!(parse(&wide), Some(Record::Switch { pid: 7, tid: 9, time: 8, on_cpu: false, out: true, other: Some(4) }));
        assert!(parse(&wide).unwrap().is_of(7) && !parse(&wide).unwrap().is_of(3));
        assert_eq!(parse(&wide[..24]), None);
        assert_eq!(parse(&[1, 2, 3]), None);
    }

    #[test]
    fn drains_records_across_the_end_of_the_ring() {
        // A 64-byte ring holding two 24-byte records from position 48: the
        // first runs off the end and goes on at the start.
        let mut data = vec![0u8; 64];
        let recs: Vec<Vec<u8>> = (0..2).map(|i| switch(i, 100 + i as u64, 0)).collect();
        let mut pos = 48usize;
        for r in &recs {
            for &b in r {
                data[pos % 64] = b;
                pos += 1;
            }
        }
        let mut seen = Vec::new();
        let mut scratch = Vec::new();
        let end = drain(&data, 48, 48 + 48, &mut scratch, |r| seen.push(r.to_vec()));
        assert_eq!(end, 96);
        assert_eq!(seen, recs);
        // A record not whole yet is left for the next poll.
        seen.clear();
        assert_eq!(drain(&data, 48, 48 + 40, &mut scratch, |r| seen.push(r.to_vec())), 72);
        assert_eq!(seen, recs[..1]);
        // Nothing to read, a head too far ahead, a record of size 0: no progress.
        assert_eq!(drain(&data, 96, 96, &mut scratch, |_| panic!()), 96);
        assert_eq!(drain(&data, 0, 65, &mut scratch, |_| panic!()), 0);
        assert_eq!(drain(&[0u8; 64], 0, 24, &mut scratch, |_| panic!()), 0);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
    }
}
