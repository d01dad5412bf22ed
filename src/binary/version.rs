//! The exact interpreter version (major.minor.patch), taken from the target
//! itself, never from a file name: `_Py_DebugOffsets.version` (3.13+), the
//! `Py_Version` constant (3.11+), or the `sys.version` text that
//! `Py_GetVersion()` keeps in a static buffer of the interpreter's data.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// "" for a final release, else e.g. "a1", "rc2".
    pub release: String,
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}{}", self.major, self.minor, self.patch, self.release)
    }
}

impl PythonVersion {
    /// Decode `PY_VERSION_HEX`.
    pub fn from_hex(hex: u64) -> Option<PythonVersion> {
        let major = ((hex >> 24) & 0xff) as u32;
        let minor = ((hex >> 16) & 0xff) as u32;
        let patch = ((hex >> 8) & 0xff) as u32;
        let level = ((hex >> 4) & 0xf) as u8;
        let serial = (hex & 0xf) as u32;
        if hex >> 32 != 0 || !(2..=3).contains(&major) || minor > 99 {
            return None;
        }
        let release = match level {
            0xa => format!("a{serial}"),
            0xb => format!("b{serial}"),
            0xc => format!("rc{serial}"),
            0xf => String::new(),
            _ => return None,
        };
        Some(PythonVersion { major, minor, patch, release })
    }

    /// Parse the start of a `sys.version` string: "3.9.18 (main, ...".
    pub fn parse(text: &str) -> Option<PythonVersion> {
        let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '+')).unwrap_or(text.len());
        let head = text[..end].trim_end_matches('+');
        let mut parts = head.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let rest = parts.next()?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let patch = rest[..digits].parse().ok()?;
        let release = rest[digits..].to_string();
        if !(release.is_empty() || release.starts_with('a') || release.starts_with('b') || release.starts_with("rc")) {
            return None;
        }
        Some(PythonVersion { major, minor, patch, release })
    }

    /// Find the `Py_GetVersion()` buffer ("3.X.Y (build info) [compiler]") in a
    /// copy of the interpreter's writable data.
    pub fn find_in_data(data: &[u8], minor_hint: Option<u32>) -> Option<PythonVersion> {
        let mut best = None;
        for (i, w) in data.windows(4).enumerate() {
            // A NUL (or start of buffer) precedes the buffer; "3." (or an old
            // "2.", which we name in the "unsupported" error) starts it.
            if !matches!(w[0], b'2' | b'3') || w[1] != b'.' || (i > 0 && data[i - 1] != 0) {
                continue;
            }
            let tail = &data[i..data.len().min(i + 256)];
            let text_len = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
            let Ok(text) = std::str::from_utf8(&tail[..text_len]) else { continue };
            // The build info in parentheses is what makes it the sys.version text.
            if !text.contains(" (") || !text.contains(')') {
                continue;
            }
            if let Some(v) = PythonVersion::parse(text) {
                if minor_hint.is_none_or(|m| m == v.minor) {
                    return Some(v);
                }
                best.get_or_insert(v);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_text() {
        assert_eq!(PythonVersion::from_hex(0x030b02f0).unwrap().to_string(), "3.11.2");
        assert_eq!(PythonVersion::from_hex(0x030f00a1).unwrap().to_string(), "3.15.0a1");
        assert!(PythonVersion::from_hex(0xdeadbeef).is_none());
        assert_eq!(PythonVersion::parse("3.9.18 (main, May  9 2026) [GCC]").unwrap().to_string(), "3.9.18");
        assert_eq!(PythonVersion::parse("3.14.0rc2 (x)").unwrap().release, "rc2");
        assert!(PythonVersion::parse("banana").is_none());
    }

    #[test]
    fn finds_version_buffer() {
        let mut data = vec![0u8; 64];
        data.extend_from_slice(b"3.8.18 (default, May 9 2026, 07:32:38) \n[GCC 12.2.0]\0");
        data.extend_from_slice(&[0u8; 16]);
        assert_eq!(PythonVersion::find_in_data(&data, None).unwrap().to_string(), "3.8.18");
    }
}
