//! Reading `str` and `bytes` objects out of the target, with hard caps on
//! length: a torn or garbage length must cost one bounded read, not a hang.

use crate::error::{Error, Result};
use crate::offsets::ObjectOffsets;
use crate::process::memory::{RemoteMemory, check_pointer, field_u32, field_u64};

/// Longest identifier or path we accept, in characters.
pub const MAX_STR_CHARS: u64 = 4096;
/// Longest line table we accept.
pub const MAX_BYTES: u64 = 1 << 20;

/// Bytes of a `str`'s header worth reading: the compact header.
pub fn unicode_head_len(o: &ObjectOffsets) -> usize {
    (o.unicode_compact_size as usize).min(128)
}

/// Where a compact `str`'s characters are, from its header: (offset from the
/// object, byte length, bytes per character, ASCII).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrShape {
    pub data_at: u64,
    pub len: usize,
    pub kind: u32,
    pub ascii: bool,
}

pub fn unicode_shape(o: &ObjectOffsets, addr: u64, head: &[u8]) -> Result<StrShape> {
    let state = field_u32(head, o.unicode_state as usize);
    let length = field_u64(head, o.unicode_length as usize);
    // PyASCIIObject.state bit-fields, located by the offsets file.
    let kind = (state & o.unicode_kind_mask) >> o.unicode_kind_mask.trailing_zeros();
    let compact = state & o.unicode_compact_mask != 0;
    let ascii = state & o.unicode_ascii_mask != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) || length > MAX_STR_CHARS {
        return Err(Error::Corrupt(format!("str at {addr:#x}: state {state:#x}, length {length}")));
    }
    let data_at = if ascii { o.unicode_ascii_size } else { o.unicode_compact_size };
    Ok(StrShape { data_at, len: (length * kind as u64) as usize, kind, ascii })
}

pub fn decode_unicode(shape: StrShape, data: &[u8]) -> String {
    match shape.kind {
        1 if shape.ascii => String::from_utf8_lossy(data).into_owned(),
        1 => data.iter().map(|&b| b as char).collect(),
        2 => data.chunks_exact(2).map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('\u{fffd}')).collect(),
        _ => data.chunks_exact(4).map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or('\u{fffd}')).collect(),
    }
}

pub fn read_unicode(mem: &dyn RemoteMemory, o: &ObjectOffsets, addr: u64) -> Result<String> {
    check_pointer(addr, "str")?;
    let mut head = [0u8; 128];
    let head = &mut head[..unicode_head_len(o)];
    mem.read(addr, head)?;
    let shape = unicode_shape(o, addr, head)?;
    let mut data = vec![0u8; shape.len];
    mem.read(addr + shape.data_at, &mut data)?;
    Ok(decode_unicode(shape, &data))
}

/// A `bytes` object's length from its `ob_size` word, capped.
pub fn bytes_len(addr: u64, ob_size: u64) -> Result<usize> {
    if ob_size > MAX_BYTES {
        return Err(Error::Corrupt(format!("bytes at {addr:#x} claims {ob_size} bytes")));
    }
    Ok(ob_size as usize)
}

pub fn read_bytes(mem: &dyn RemoteMemory, o: &ObjectOffsets, addr: u64) -> Result<Vec<u8>> {
    check_pointer(addr, "bytes")?;
    let size = bytes_len(addr, mem.read_u64(addr + o.bytes_ob_size)?)?;
    mem.read_vec(addr + o.bytes_ob_sval, size)
}
