//! One target process under the kernel sampler: its entry in the
//! program's TARGETS map, its tids in THREADS (from the thread list read
//! live, as every sampler reads it), and its [`Converter`].

use rustc_hash::FxHashMap as HashMap;
use std::time::{Duration, Instant};

use crate::attach::Attached;
use crate::error::{Error, Result};
use crate::process::memory::RemoteMemory;
use crate::python::thread_names::NameCache;
use crate::python::threads::{ThreadList, ThreadState, find_pthread_tid_offset};

use super::convert::{Converter, target_config};
use super::loader::KernelSampler;
use super::native::KernelNative;
use super::tasks::KernelTasks;

/// The thread list is read again at least this often (threads that ended
/// leave the map), and at most this often when records name unknown tids.
const REFRESH_EVERY: Duration = Duration::from_millis(500);
const REFRESH_AT_MOST: Duration = Duration::from_millis(5);

pub struct KernelTarget {
    pub pid: i32,
    pub converter: Converter,
    /// `--native`: unwinds and merges each record's stack copy.
    pub native: Option<KernelNative>,
    /// `--async`: reads each record's copy of its task graph.
    pub tasks: Option<KernelTasks>,
    /// tid → thread state, as last put in the map.
    tids: HashMap<u32, u64>,
    /// The same tids, sorted: wall mode walks them at every tick.
    sorted: Vec<u32>,
    /// tid → (interpreter, `threading` ident), for [`Self::python_name`].
    idents: HashMap<u32, (u64, u64)>,
    /// The `threading` names every output shows, as the other samplers do.
    py_names: NameCache,
    list: ThreadList,
    states: Vec<ThreadState>,
    buf: Vec<u8>,
    /// ≤ 3.10: where glibc keeps the tid in `struct pthread`.
    pthread_tid: Option<u64>,
    refreshed: Option<Instant>,
    /// A record named a tid the map lacks: read the list again soon.
    stale: bool,
}

/// A target's `threading` names by host tid.
pub struct PythonNames<'a> {
    idents: &'a HashMap<u32, (u64, u64)>,
    names: &'a NameCache,
}

impl<'a> PythonNames<'a> {
    pub fn get(&self, tid: u32) -> Option<&'a str> {
        let &(interp, ident) = self.idents.get(&tid)?;
        self.names.get(interp, ident)
    }
}

impl KernelTarget {
    /// Register `a` with the program. Errors when its frames need more
    /// bytes than the program copies (no such build is known).
    pub fn new(k: &mut KernelSampler, a: &Attached, tasks: Option<crate::python::asyncio::AsyncMode>) -> Result<KernelTarget> {
        let o = &a.interp.offsets;
        // The first interpreter of the list: the main one unless the program made
        // subinterpreters, whose GIL (3.12+) the capture does not read.
        let main = a.mem.read_u64(a.interp.runtime + o.runtime.interpreters_head)?;
        let cfg = target_config(&a.interp, main)
            .ok_or_else(|| Error::Corrupt(format!("CPython {}'s frames are larger than the kernel sampler copies", o.version)))?;
        k.set_target(a.target.pid as u32, cfg)?;
        let mut converter = Converter::new(&a.interp, main);
        let tasks = tasks.filter(|_| k.tasks()).map(KernelTasks::new);
        if tasks.is_some() {
            converter.keep_addresses();
        }
        if k.native().is_some() {
            converter.walk_whole();
        }
        let mut t = KernelTarget {
            pid: a.target.pid,
            converter,
            native: k.native().map(|o| KernelNative::new(a, o)),
            tasks,
            tids: HashMap::default(),
            sorted: Vec::new(),
            idents: HashMap::default(),
            py_names: NameCache::default(),
            list: ThreadList::default(),
            states: Vec::new(),
            buf: Vec::new(),
            pthread_tid: None,
            refreshed: None,
            stale: true,
        };
        if let Err(e) = t.refresh(k, a) {
            t.forget(k);
            return Err(e);
        }
        // Kept before this process was a target, they are another
        // process's, whose thread had the same tid (at worst one of its
        // own, kept since: then /proc's registers serve).
        for &tid in t.tids.keys() {
            k.forget_left(tid);
        }
        Ok(t)
    }

    /// `--async`: hand the program what it lacks of this target's task
    /// graphs (`KernelTasks::sync`); what the graphs' reads counted.
    pub fn sync_tasks(&mut self, k: &mut KernelSampler, a: &Attached, made: &mut crate::profile::model::KernelSampling) -> crate::counts::Counters {
        let Some(t) = self.tasks.as_mut() else { return Default::default() };
        t.sync(k, a, &self.converter, self.tids.values().copied());
        let (copies, cut) = t.take_copies();
        made.task_graphs += copies;
        made.task_graphs_cut += cut;
        t.take_counts()
    }

    /// The host tids of the threads in the map, in order.
    pub fn tids(&self) -> impl Iterator<Item = u32> + '_ {
        self.sorted.iter().copied()
    }

    pub fn note_unknown(&mut self) {
        self.stale = true;
    }

    pub fn due(&self) -> bool {
        match self.refreshed {
            None => true,
            Some(t) => t.elapsed() >= REFRESH_EVERY || (self.stale && t.elapsed() >= REFRESH_AT_MOST),
        }
    }

    /// Read the thread list and bring the map in line with it.
    pub fn refresh(&mut self, k: &mut KernelSampler, a: &Attached) -> Result<()> {
        let o = &a.interp.offsets;
        self.refreshed = Some(Instant::now());
        self.list.read(&a.mem, o, a.interp.runtime, &mut self.states, &mut self.buf)?;
        if o.thread.native_thread_id.is_none() && self.pthread_tid.is_none() {
            let pthreads: Vec<u64> = self.states.iter().map(|t| t.thread_id).collect();
            let (pid, tids) = a.target.inner_ids();
            self.pthread_tid = find_pthread_tid_offset(&a.mem, pid, &tids, &pthreads);
        }
        self.py_names.refresh(&a.mem, o, self.states.iter().map(|t| (t.interp, t.thread_id)), false);
        self.idents.clear();
        let mut now: HashMap<u32, u64> = HashMap::with_capacity_and_hasher(self.states.len(), Default::default());
        for ts in &self.states {
            let tid = ts.native_id.or_else(|| self.pthread_tid.and_then(|off| a.mem.read_u32(ts.thread_id + off).ok().map(u64::from)));
            // The program sees the host's ids; the thread state holds the
            // target's own (they differ in a container's PID namespace).
            let tid = tid.and_then(|t| a.target.host_tid(t));
            if let Some(tid) = tid.filter(|&t| t > 0 && t <= i32::MAX as u64) {
                now.insert(tid as u32, ts.addr);
                self.idents.insert(tid as u32, (ts.interp, ts.thread_id));
            }
        }
        for (&tid, &ts) in &now {
            if self.tids.get(&tid) != Some(&ts) {
                k.set_thread(tid, ts)?;
            }
        }
        for tid in self.tids.keys().filter(|t| !now.contains_key(t)) {
            k.remove_thread(*tid);
        }
        self.tids = now;
        self.sorted.clear();
        self.sorted.extend(self.tids.keys().copied());
        self.sorted.sort_unstable();
        self.stale = false;
        Ok(())
    }

    /// Host thread `tid`'s `threading` name, if it has one and it was read.
    pub fn python_name(&self, tid: u32) -> Option<&str> {
        PythonNames { idents: &self.idents, names: &self.py_names }.get(tid)
    }

    /// The converter and the `threading` names beside it (a record's
    /// stack and its thread's name), and `--native`'s unwinder, in one borrow.
    pub fn parts(&mut self) -> (&mut Converter, PythonNames<'_>, Option<&mut KernelNative>) {
        (&mut self.converter, PythonNames { idents: &self.idents, names: &self.py_names }, self.native.as_mut())
    }

    /// Whether host thread `tid` is in the map.
    pub fn has_thread(&self, tid: u32) -> bool {
        self.tids.contains_key(&tid)
    }

    /// Take the target and its threads out of the program's maps.
    pub fn forget(&mut self, k: &mut KernelSampler) {
        k.remove_target(self.pid as u32);
        if let Some(t) = self.tasks.as_mut() {
            t.forget(k, self.pid as u32);
        }
        for tid in self.tids.keys() {
            k.remove_thread(*tid);
        }
        self.tids.clear();
        self.sorted.clear();
    }
}
