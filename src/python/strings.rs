//! Reading `str` and `bytes` objects out of the target, with hard caps on
//! length: a torn or garbage length must cost one bounded read, not a hang.

use crate::error::{Error, Result};
use crate::offsets::ObjectOffsets;
use crate::process::memory::{RemoteMemory, field_u32, field_u64};

/// Longest identifier or path we accept, in characters.
pub const MAX_STR_CHARS: u64 = 4096;
/// Longest line table we accept.
pub const MAX_BYTES: u64 = 1 << 20;

pub fn read_unicode(mem: &dyn RemoteMemory, o: &ObjectOffsets, addr: u64) -> Result<String> {
    if addr == 0 || addr % 8 != 0 {
        return Err(Error::Corrupt(format!("bad str pointer {addr:#x}")));
    }
    let mut head = [0u8; 128];
    let head_len = (o.unicode_compact_size as usize).min(head.len());
    mem.read(addr, &mut head[..head_len])?;
    let state = field_u32(&head, o.unicode_state as usize);
    let length = field_u64(&head, o.unicode_length as usize);
    // PyASCIIObject.state bit-fields (stable 3.8–3.15, default builds):
    // interned:2, kind:3, compact:1, ascii:1, ...
    let kind = (state >> 2) & 0x7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact || !matches!(kind, 1 | 2 | 4) || length > MAX_STR_CHARS {
        return Err(Error::Corrupt(format!("str at {addr:#x}: state {state:#x}, length {length}")));
    }
    let data_at = if ascii { o.unicode_ascii_size } else { o.unicode_compact_size };
    let mut data = vec![0u8; (length * kind as u64) as usize];
    mem.read(addr + data_at, &mut data)?;
    Ok(match kind {
        1 if ascii => String::from_utf8_lossy(&data).into_owned(),
        1 => data.iter().map(|&b| b as char).collect(),
        2 => data.chunks_exact(2).map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('\u{fffd}')).collect(),
        _ => data.chunks_exact(4).map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or('\u{fffd}')).collect(),
    })
}

pub fn read_bytes(mem: &dyn RemoteMemory, o: &ObjectOffsets, addr: u64) -> Result<Vec<u8>> {
    if addr == 0 || addr % 8 != 0 {
        return Err(Error::Corrupt(format!("bad bytes pointer {addr:#x}")));
    }
    let size = mem.read_u64(addr + o.bytes_ob_size)?;
    if size > MAX_BYTES {
        return Err(Error::Corrupt(format!("bytes at {addr:#x} claims {size} bytes")));
    }
    mem.read_vec(addr + o.bytes_ob_sval, size as usize)
}
