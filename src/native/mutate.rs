//! Test-only helpers the perf-map and jitdump parser tests share: a seeded
//! generator and byte mutations for their fuzz tests (each adds mutations of
//! its own format on top), and scratch files owned by us.

use std::path::PathBuf;

/// A fresh directory for one test's files.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pyprof-native-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Our uid: the owner the loaders must accept.
pub fn my_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// Mutation `op` (0, 1 or 2): flip a bit, copy a slice elsewhere, or truncate.
pub fn apply(op: usize, buf: &mut Vec<u8>, rng: &mut XorShift) {
    match op {
        0 => {
            let i = rng.below(buf.len());
            if let Some(b) = buf.get_mut(i) {
                *b ^= 1 << rng.below(8);
            }
        }
        1 => {
            let from = rng.below(buf.len());
            let to = rng.below(buf.len());
            let len = rng.below(buf.len() - from.max(to));
            let chunk = buf[from..from + len].to_vec();
            buf.splice(to..to, chunk);
        }
        _ => buf.truncate(rng.below(buf.len() + 1)),
    }
}
