//! `--native` on top of a Python snapshot: unwind each held thread's C
//! stack while the acquirer holds it (`acquire::stop_all`), then, with the
//! threads let go, name the frames and merge them with the Python frames
//! read in the same instant. Owns the native scratch of a session.

use crate::attach::Attached;
use crate::error::Result;
use crate::native::merge::{self, NativeFrame};
use crate::native::{NativeOptions, NativeRaw, NativeState};
use crate::process::memory::RemoteMemory;
use crate::python::snapshot::Snapshotter;
use crate::stack::{Regs, ThreadStack};

pub struct NativeLayer {
    pub state: NativeState,
    /// One (frames, unwound to the end, had registers) slot per thread,
    /// reused across samples.
    raw: Vec<(Vec<NativeRaw>, bool, bool)>,
    frames: Vec<NativeFrame>,
}

impl NativeLayer {
    pub fn new(attached: &Attached, opts: NativeOptions) -> Result<NativeLayer> {
        Ok(NativeLayer { state: NativeState::new(&attached.target, opts), raw: Vec::new(), frames: Vec::new() })
    }

    /// Before a snapshot: no thread has registers yet.
    pub fn begin(&mut self) {
        self.raw.iter_mut().for_each(|slot| slot.2 = false);
    }

    /// Unwind the C stack of thread `i` of the snapshot being taken, from
    /// its registers, while it is held.
    pub fn unwind_held(&mut self, mem: &dyn RemoteMemory, i: usize, regs: Regs) {
        if self.raw.len() <= i {
            self.raw.resize_with(i + 1, Default::default);
        }
        let slot = &mut self.raw[i];
        slot.2 = true;
        slot.1 = self.state.unwind_raw(mem, regs, &mut slot.0);
    }

    /// With the threads let go: name each unwound stack and merge it with
    /// the Python frames of its thread.
    pub fn merge(&mut self, python: &Snapshotter, threads: &mut [ThreadStack]) {
        if self.raw.len() < threads.len() {
            self.raw.resize_with(threads.len(), Default::default);
        }
        let mut merged = Vec::new();
        for (i, t) in threads.iter_mut().enumerate() {
            self.state.counts.native_stacks += 1;
            let (raw, complete, had_regs) = &self.raw[i];
            if !had_regs {
                self.state.counts.native_no_registers += 1;
                continue;
            }
            self.state.symbolize(raw, &mut self.frames);
            merge::merge(&self.frames, *complete, &t.frames, python.groups(i), &mut merged).count(&mut self.state.counts);
            std::mem::swap(&mut t.frames, &mut merged);
        }
    }
}
