//! `--native`, wall mode: the user registers a thread saved as it last
//! entered the kernel, read by the `saved_regs` task iterator of the BPF
//! object, run over that one thread (Linux 6.1+: an iterator link can name
//! a tid). A thread asleep since before the program ran left none in LEFT,
//! and `/proc/PID/task/TID/syscall` shows its sp and ip but not its frame
//! pointer, which a frame-pointer build's unwind needs.
//!
//! aya 0.13 loads no iterators, so this one program is loaded and run with
//! bpf(2) itself: it uses no map and calls helpers only, so its
//! instructions need no relocation.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::stack::Regs;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_ITER: u32 = 28;
/// `union bpf_attr` as large as any command here uses, zero beyond.
const ATTR_SIZE: usize = 128;
/// `sizeof(union bpf_iter_link_info)`: its `task` member is {tid, pid, pid_fd}.
const LINK_INFO_SIZE: usize = 16;
const SECTION: &str = "iter/task";

pub struct SavedRegs {
    prog: OwnedFd,
}

fn put_u32(a: &mut [u8], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(a: &mut [u8], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// bpf(cmd, attr): a new fd, or the error.
fn bpf(cmd: libc::c_long, attr: &mut [u8; ATTR_SIZE]) -> std::io::Result<OwnedFd> {
    // SAFETY: attr is a valid, writable union bpf_attr of ATTR_SIZE bytes
    // whose pointers, if any, point at buffers the caller keeps alive.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), ATTR_SIZE as u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl SavedRegs {
    /// Load the iterator out of `object` (the capture program's ELF).
    pub fn load(object: &[u8]) -> Result<SavedRegs, String> {
        let elf = goblin::elf::Elf::parse(object).map_err(|e| format!("BPF object: {e}"))?;
        let sh = elf
            .section_headers
            .iter()
            .find(|sh| elf.shdr_strtab.get_at(sh.sh_name) == Some(SECTION))
            .ok_or_else(|| format!("BPF object has no {SECTION} section"))?;
        let insns = object.get(sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize).ok_or("BPF object: section out of bounds")?.to_vec();
        let btf = aya::Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {e}"))?;
        let target = btf.id_by_type_name_kind("bpf_iter_task", aya_obj::btf::BtfKind::Func).map_err(|e| format!("bpf_iter_task in the kernel's BTF: {e}"))?;
        let license = c"GPL";
        let mut log = vec![0u8; 1 << 16];
        let mut attr = [0u8; ATTR_SIZE];
        put_u32(&mut attr, 0, BPF_PROG_TYPE_TRACING);
        put_u32(&mut attr, 4, (insns.len() / 8) as u32);
        put_u64(&mut attr, 8, insns.as_ptr() as u64);
        put_u64(&mut attr, 16, license.as_ptr() as u64);
        put_u32(&mut attr, 24, 1);
        put_u32(&mut attr, 28, log.len() as u32);
        put_u64(&mut attr, 32, log.as_mut_ptr() as u64);
        attr[48..48 + 10].copy_from_slice(b"saved_regs");
        put_u32(&mut attr, 68, BPF_TRACE_ITER);
        put_u32(&mut attr, 108, target);
        match bpf(BPF_PROG_LOAD, &mut attr) {
            Ok(prog) => Ok(SavedRegs { prog }),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(0);
                let last = String::from_utf8_lossy(&log[..end]).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
                Err(format!("the kernel refused the iterator: {e}{}", if last.is_empty() { String::new() } else { format!(" ({last})") }))
            }
        }
    }

    /// The registers host thread `tid` saved as it last entered the
    /// kernel (a thread off CPU: those it will leave with).
    pub fn of(&self, tid: u32) -> Option<Regs> {
        let mut info = [0u8; LINK_INFO_SIZE];
        put_u32(&mut info, 0, tid);
        let mut attr = [0u8; ATTR_SIZE];
        put_u32(&mut attr, 0, self.prog.as_raw_fd() as u32);
        put_u32(&mut attr, 8, BPF_TRACE_ITER);
        put_u64(&mut attr, 16, info.as_ptr() as u64);
        put_u32(&mut attr, 24, LINK_INFO_SIZE as u32);
        let link = bpf(BPF_LINK_CREATE, &mut attr).ok()?;
        let mut attr = [0u8; ATTR_SIZE];
        put_u32(&mut attr, 0, link.as_raw_fd() as u32);
        let iter = bpf(BPF_ITER_CREATE, &mut attr).ok()?;
        let mut out = [0u8; 48];
        // SAFETY: a read into a local buffer of its own length.
        let n = unsafe { libc::read(iter.as_raw_fd(), out.as_mut_ptr().cast(), out.len()) };
        // One thread, one `struct left`: ip, sp, bp.
        (n == 24).then(|| {
            let w = |i: usize| u64::from_le_bytes(out[8 * i..8 * i + 8].try_into().unwrap());
            Regs { ip: w(0), sp: w(1), bp: w(2) }
        })
    }
}
