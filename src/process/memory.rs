//! Reading the target's memory. Everything that touches remote memory goes
//! through [`RemoteMemory`], so walkers can run on a live process or on a
//! captured snapshot alike. [`VmReader`] is the live implementation: it uses
//! `process_vm_readv` only, so the target is never stopped or ptraced.

use std::cell::{Cell, RefCell};

use crate::error::{Error, Result, permission_hint};

/// Addresses here are always avma (actual virtual memory addresses in the target).
pub trait RemoteMemory {
    /// Fill `buf` from `addr`. A short read is an error.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()>;

    /// Read `ranges` (address, length) into `dst`, back to back and in order,
    /// in as few calls as the implementation can; stop at the first range
    /// that cannot be read whole. Returns the bytes read: a prefix of the
    /// ranges arrived (a live reader may also deliver the start of the range
    /// that faulted, up to its first unmapped page), the rest did not.
    /// `dst` must hold them all.
    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        let mut off = 0;
        for &(addr, len) in ranges {
            if self.read(addr, &mut dst[off..off + len]).is_err() {
                break;
            }
            off += len;
        }
        off
    }

    /// How many reads reached the memory's source so far (syscalls for a
    /// live process). Orders the reads of a session in time: see
    /// `process::prefetch::read_time`.
    fn calls(&self) -> u64 {
        0
    }

    /// When the bytes just read at `addr..addr+len` were copied out of the
    /// target, on a clock that orders every read of a session (see
    /// `process::prefetch::read_time`), with the held range they came from,
    /// if any. Only a per-sample view knows; anything else says "now, by
    /// itself": the latest time there is.
    fn read_time(&self, _addr: u64, _len: usize) -> (u64, Option<(u64, u64)>) {
        (u64::MAX, None)
    }

    /// Several reads in one go; implementations batch them into one syscall.
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (addr, buf) in reqs.iter_mut() {
            self.read(*addr, buf)?;
        }
        Ok(())
    }

    fn read_u64(&self, addr: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_u32(&self, addr: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }
}

/// Live reader over `process_vm_readv`.
pub struct VmReader {
    pid: i32,
    syscalls: Cell<u64>,
    /// Bytes copied out of the target so far (what a sample costs besides
    /// its syscalls).
    bytes: Cell<u64>,
    /// iovec arrays (local, remote) reused by every batched read, so the
    /// per-sample path allocates nothing. Kept as plain words, laid out as
    /// `libc::iovec` (checked below), so the reader stays `Send`.
    iovs: RefCell<(IovWords, IovWords)>,
    /// See [`VmReader::last_read_end`].
    read_end: Cell<u64>,
}

/// iovecs as (base, length) words.
type IovWords = Vec<[usize; 2]>;

const _: () = assert!(std::mem::size_of::<libc::iovec>() == std::mem::size_of::<[usize; 2]>());

/// The kernel caps one process_vm_readv at IOV_MAX iovecs.
const IOV_MAX: usize = 1024;

impl VmReader {
    pub fn new(pid: i32) -> Self {
        VmReader { pid, syscalls: Cell::new(0), bytes: Cell::new(0), iovs: RefCell::new((Vec::new(), Vec::new())), read_end: Cell::new(0) }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// When the last `process_vm_readv` returned (CLOCK_MONOTONIC ns): no
    /// byte read so far was read after it.
    pub fn last_read_end(&self) -> u64 {
        self.read_end.get()
    }

    fn mark_read_end(&self) {
        self.read_end.set(super::monotonic_ns());
    }

    /// Number of process_vm_readv calls made so far (the main cost of a sample).
    pub fn syscalls(&self) -> u64 {
        self.syscalls.get()
    }

    /// Bytes read from the target so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes.get()
    }

    fn classify(&self, addr: u64, len: usize, err: std::io::Error) -> Error {
        match err.raw_os_error() {
            Some(libc::ESRCH) => Error::ProcessGone(self.pid),
            Some(libc::EPERM) | Some(libc::EACCES) => {
                // EPERM also comes back once a pid has been reaped and reused by
                // a process of another user: tell the two apart.
                if !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
                    Error::ProcessGone(self.pid)
                } else {
                    Error::PermissionDenied { pid: self.pid, hint: permission_hint() }
                }
            }
            _ => Error::Read { pid: self.pid, addr, len, source: err },
        }
    }

    /// One `process_vm_readv` per IOV_MAX ranges of `ranges`, destinations
    /// laid out back to back in `dst`.
    fn scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        let total: usize = ranges.iter().map(|r| r.1).sum();
        assert!(total <= dst.len(), "scatter read of {total} bytes into {}", dst.len());
        let mut iovs = self.iovs.borrow_mut();
        let (local, remote) = &mut *iovs;
        let base = dst.as_mut_ptr() as usize;
        let (mut done, mut off) = (0, 0);
        for chunk in ranges.chunks(IOV_MAX) {
            local.clear();
            remote.clear();
            let mut want = 0;
            for &(addr, len) in chunk {
                local.push([base + off, len]);
                remote.push([addr as usize, len]);
                off += len;
                want += len;
            }
            self.syscalls.set(self.syscalls.get() + 1);
            // SAFETY: the words are laid out as iovecs (asserted above); the
            // local ones cover disjoint parts of `dst`, which is borrowed
            // mutably for the call and long enough (asserted); remote ones are
            // only read by the kernel, which validates them.
            let n = unsafe {
                libc::process_vm_readv(
                    self.pid,
                    local.as_ptr().cast::<libc::iovec>(),
                    local.len() as libc::c_ulong,
                    remote.as_ptr().cast::<libc::iovec>(),
                    remote.len() as libc::c_ulong,
                    0,
                )
            };
            self.mark_read_end();
            if n <= 0 {
                break;
            }
            self.bytes.set(self.bytes.get() + n as u64);
            done += n as usize;
            if n as usize != want {
                break;
            }
        }
        done
    }

    fn readv(&self, local: &[libc::iovec], remote: &[libc::iovec], total: usize, first: u64) -> Result<()> {
        self.syscalls.set(self.syscalls.get() + 1);
        // SAFETY: every local iovec points into a live &mut [u8] owned by the
        // caller for the duration of this call; remote iovecs are only read
        // by the kernel, which validates them.
        let n = unsafe { libc::process_vm_readv(self.pid, local.as_ptr(), local.len() as libc::c_ulong, remote.as_ptr(), remote.len() as libc::c_ulong, 0) };
        self.mark_read_end();
        if n < 0 {
            return Err(self.classify(first, total, std::io::Error::last_os_error()));
        }
        self.bytes.set(self.bytes.get() + n as u64);
        if n as usize != total {
            return Err(Error::Read {
                pid: self.pid,
                addr: first,
                len: total,
                source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("short read ({n} bytes)")),
            });
        }
        Ok(())
    }
}

impl RemoteMemory for VmReader {
    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        self.scatter(ranges, dst)
    }

    fn calls(&self) -> u64 {
        self.syscalls.get()
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let local = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }];
        let remote = [libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() }];
        self.readv(&local, &remote, buf.len(), addr)
    }

    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        for chunk in reqs.chunks_mut(IOV_MAX) {
            let mut local = Vec::with_capacity(chunk.len());
            let mut remote = Vec::with_capacity(chunk.len());
            let mut total = 0;
            for (addr, buf) in chunk.iter_mut() {
                if buf.is_empty() {
                    continue;
                }
                local.push(libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() });
                remote.push(libc::iovec { iov_base: *addr as *mut libc::c_void, iov_len: buf.len() });
                total += buf.len();
            }
            if total > 0 {
                self.readv(&local, &remote, total, chunk[0].0)?;
            }
        }
        Ok(())
    }
}

/// Above any user-space address (x86-64 with 5-level paging: 57 bits), so
/// `ptr + offset` of a checked pointer cannot overflow.
const MAX_USER_ADDR: u64 = 1 << 57;

/// Could `addr` point at an object in the target: non-null, 8-byte aligned
/// (every CPython object is), and a user-space address.
pub fn plausible_pointer(addr: u64) -> bool {
    addr != 0 && addr % 8 == 0 && addr < MAX_USER_ADDR
}

/// [`plausible_pointer`], or an error naming what the pointer was for.
pub fn check_pointer(addr: u64, what: &str) -> Result<()> {
    if !plausible_pointer(addr) {
        return Err(Error::Corrupt(format!("bad {what} pointer {addr:#x}")));
    }
    Ok(())
}

/// Little-endian field access into a local copy of a remote struct.
/// Out-of-range offsets read as zero: offsets were validated against the
/// struct sizes at attach, so this only happens on a torn or bogus buffer,
/// which the caller's consistency checks then reject.
pub fn field_u64(buf: &[u8], off: usize) -> u64 {
    buf.get(off..off + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

pub fn field_u32(buf: &[u8], off: usize) -> u32 {
    buf.get(off..off + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
}

pub fn field_u8(buf: &[u8], off: usize) -> u8 {
    buf.get(off).copied().unwrap_or(0)
}
