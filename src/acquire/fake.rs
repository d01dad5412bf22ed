//! A scripted live side for the rules of the proof (`exact/tests.rs`):
//! memory recorded from a real interpreter (`fixtures/replay/`), and a
//! holder whose replies (which threads stop, which are proven off CPU, which
//! got a CPU since) a test writes, with memory that changes at scripted
//! events: when a thread is stopped, when it is stepped, or when a word is
//! read again.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::HoldPolicy;
use super::live::{Held, Live};
use crate::binary::version::PythonVersion;
use crate::error::{Error, Result};
use crate::process::memory::RemoteMemory;
use crate::process::replay::{CaptureInfo, Replay};
use crate::python::interpreter::Interpreter;
use crate::python::snapshot::Source;

/// Bytes to write at an address.
pub type Patch = (u64, Vec<u8>);

/// What the test says the process does, and what it saw done.
#[derive(Default)]
pub struct Script {
    pub threads: Vec<i32>,
    /// Context-switch records follow holders.
    pub tracking: bool,
    /// Threads the records prove on no CPU, with their switch-ins.
    pub off_cpu: Vec<(i32, u32)>,
    /// Threads that got a CPU after they were proven off it.
    pub ran: Vec<i32>,
    /// Threads that cannot be stopped.
    pub refuse: Vec<i32>,
    /// Written when a thread is stopped (once).
    pub on_stop: Vec<(i32, Vec<Patch>)>,
    /// Written when a thread has been stepped (once).
    pub on_step: Vec<(i32, Vec<Patch>)>,
    /// Written just before word `.0` is read for the `.1`th time (1: the
    /// first read sees the patch).
    pub on_read: Option<(u64, u32, Vec<Patch>)>,
    /// Whether a step set going, or a stop left pending, comes (false: it
    /// waits for a CPU).
    pub steps_stop: bool,
    /// Threads that leave their CPU before their stop: `add_or_freeze`
    /// freezes them (interrupted, their stop pending until `steps_stop`).
    pub freezes: Vec<i32>,
    /// Every thread ever stopped, in order.
    pub stopped: Vec<i32>,
    /// Instructions stepped, per step call.
    pub steps: Vec<i32>,
    /// Sets of held threads made (`Live::hold_none`).
    pub holds: usize,
}

impl Script {
    fn take_patches(list: &mut Vec<(i32, Vec<Patch>)>, tid: i32) -> Vec<Patch> {
        match list.iter().position(|e| e.0 == tid) {
            Some(i) => list.remove(i).1,
            None => Vec::new(),
        }
    }
}

/// Recorded memory that applies `Script::on_read` as it is read.
pub struct Memory {
    pub replay: Replay,
    script: Rc<RefCell<Script>>,
}

impl Memory {
    fn tick(&self, addr: u64, len: usize) {
        // A test that reads while it writes the script is not reading for the acquirer.
        let Ok(mut s) = self.script.try_borrow_mut() else { return };
        let Some((word, n, _)) = s.on_read.as_mut() else { return };
        if (addr..addr + len as u64).contains(word) {
            *n -= 1;
            if *n == 0 {
                for (at, bytes) in s.on_read.take().unwrap().2 {
                    self.replay.patch(at, &bytes);
                }
            }
        }
    }
}

impl RemoteMemory for Memory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.tick(addr, buf.len());
        self.replay.read(addr, buf)
    }

    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        for &(addr, len) in ranges {
            self.tick(addr, len);
        }
        self.replay.read_scatter(ranges, dst)
    }

    fn calls(&self) -> u64 {
        self.replay.calls()
    }
}

/// A recorded process with a scripted holder.
pub struct Fake {
    pub mem: Rc<Memory>,
    pub interp: Interpreter,
    pub info: CaptureInfo,
    pub script: Rc<RefCell<Script>>,
}

impl Fake {
    /// The recording of interpreter `label` (`fixtures/replay/`).
    pub fn load(label: &str) -> Fake {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/replay");
        let info: CaptureInfo = serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{label}.json"))).unwrap()).unwrap();
        let replay = Replay::load(std::fs::File::open(dir.join(format!("{label}.mem.gz"))).unwrap()).unwrap();
        let version = PythonVersion::parse(&info.python).unwrap();
        let interp = Interpreter::from_memory(&replay, &version, info.runtime, info.image.clone(), info.code_version_global).unwrap();
        let threads = info.threads.iter().filter_map(|t| t.native_id).map(|n| n as i32).collect();
        let script = Rc::new(RefCell::new(Script { threads, steps_stop: true, ..Script::default() }));
        Fake { mem: Rc::new(Memory { replay, script: script.clone() }), interp, info, script }
    }

    pub fn patch(&self, patches: &[Patch]) {
        for (addr, bytes) in patches {
            self.mem.replay.patch(*addr, bytes);
        }
    }
}

/// Threads the fake holds.
pub struct FakeHeld {
    mem: Rc<Memory>,
    script: Rc<RefCell<Script>>,
    pid: i32,
    held: Vec<i32>,
    /// Interrupted, their stop not taken in yet.
    frozen: Vec<i32>,
}

impl FakeHeld {
    fn stop(&mut self, tid: i32) -> Result<()> {
        if self.held.contains(&tid) {
            return Ok(());
        }
        let patches = {
            let mut s = self.script.borrow_mut();
            if s.refuse.contains(&tid) {
                return Err(Error::CannotStop { pid: self.pid, why: format!("thread {tid} refused (scripted)") });
            }
            s.stopped.push(tid);
            Script::take_patches(&mut s.on_stop, tid)
        };
        self.write(patches);
        self.held.push(tid);
        Ok(())
    }

    fn write(&self, patches: Vec<Patch>) {
        for (addr, bytes) in patches {
            self.mem.replay.patch(addr, &bytes);
        }
    }

    fn stepped(&mut self, tid: i32, n: u32) {
        let patches = {
            let mut s = self.script.borrow_mut();
            s.steps.extend(std::iter::repeat_n(tid, n as usize));
            Script::take_patches(&mut s.on_step, tid)
        };
        self.write(patches);
    }
}

impl Held for FakeHeld {
    fn add(&mut self, tids: &[i32], _regs: bool) -> Result<()> {
        tids.iter().try_for_each(|&t| self.stop(t))
    }

    fn add_or_freeze(&mut self, tids: &[i32], _off_cpu: &mut dyn FnMut(i32) -> bool) -> Result<()> {
        let freezes = self.script.borrow().freezes.clone();
        for &t in tids {
            if freezes.contains(&t) {
                self.script.borrow_mut().stopped.push(t);
                self.frozen.push(t);
            } else {
                self.stop(t)?;
            }
        }
        Ok(())
    }

    fn holds(&self, tid: i32) -> bool {
        self.held.contains(&tid)
    }

    fn holds_or_freezes(&self, tid: i32) -> bool {
        self.holds(tid) || self.frozen.contains(&tid)
    }

    fn is_frozen(&self, tid: i32) -> bool {
        self.frozen.contains(&tid)
    }

    fn settle_frozen(&mut self, _wait: Duration) -> bool {
        if !self.script.borrow().steps_stop {
            return self.frozen.is_empty();
        }
        let frozen = std::mem::take(&mut self.frozen);
        self.held.extend(frozen);
        true
    }

    fn run_on(&mut self, tid: i32, n: u32) -> bool {
        if self.frozen.contains(&tid) && !self.settle_frozen(Duration::ZERO) {
            return false;
        }
        if !self.holds(tid) || !self.script.borrow().steps_stop {
            return false;
        }
        self.stepped(tid, n);
        true
    }

    fn was_job_stopped(&self, _tid: i32) -> bool {
        false
    }

    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.frozen.is_empty()
    }

    fn held(&self) -> Duration {
        Duration::from_micros(self.held.len() as u64)
    }
}

impl Live for Fake {
    type Held = FakeHeld;

    fn pid(&self) -> i32 {
        self.script.borrow().threads.first().copied().unwrap_or(1)
    }

    fn source(&self) -> Source<'_> {
        Source { mem: &*self.mem, interp: &self.interp, target: None }
    }

    fn hold_none(&self, _policy: HoldPolicy) -> FakeHeld {
        self.script.borrow_mut().holds += 1;
        FakeHeld { mem: self.mem.clone(), script: self.script.clone(), pid: self.pid(), held: Vec::new(), frozen: Vec::new() }
    }

    fn threads(&self) -> Vec<i32> {
        self.script.borrow().threads.clone()
    }

    fn task_state(&self, tid: i32) -> Option<char> {
        Some(if self.off_cpu(tid).is_some() { 'S' } else { 'R' })
    }

    fn track_holders(&self) -> bool {
        self.script.borrow().tracking
    }

    fn follows_holders(&self) -> bool {
        self.track_holders()
    }

    fn proves_holders_from_the_start(&self) -> bool {
        self.track_holders()
    }

    fn poll_run_states(&self) {}

    fn off_cpu(&self, tid: i32) -> Option<u32> {
        self.script.borrow().off_cpu.iter().find(|o| o.0 == tid).map(|o| o.1)
    }

    fn ran_before(&self, tid: i32, _ins: u32, _t: u64) -> bool {
        self.script.borrow().ran.contains(&tid)
    }

    fn last_read_end(&self) -> u64 {
        self.mem.calls()
    }
}
