//! Loading the capture program and attaching it: one software cpu-clock
//! perf event per online CPU, firing every 1/rate s of CPU time, so a
//! thread on a CPU is sampled at the rate whichever CPU it runs on, and a
//! thread off every CPU costs nothing. aya loads it: a pure-Rust loader, so
//! neither building nor installing pyprof needs a C toolchain or libbpf.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventLinkId, PerfEventScope, PerfTypeId, SamplePolicy, perf_sw_ids};
use aya::programs::{PerfEvent, RawTracePoint};
use aya::{Ebpf, EbpfLoader};

use super::record::{Left, Settings, TargetConfig, ThreadEntry};
use super::tasks::plan::{Plan, PlanKey, TasksTarget};

/// The program, built by scripts/build-bpf.sh from bpf/capture.bpf.c.
static OBJECT: &[u8] = aya::include_bytes_aligned!("bpf/capture.bpf.o");
/// `--native`'s task iterator, from bpf/saved_regs.bpf.c (`saved_regs`).
static SAVED_REGS: &[u8] = aya::include_bytes_aligned!("bpf/saved_regs.bpf.o");

/// Why the kernel sampler cannot run here: said once, and the ptrace
/// sampler used instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct Refused {
    pub why: String,
}

fn refused(what: &str, e: impl std::fmt::Display) -> Refused {
    let full = e.to_string();
    let lower = full.to_lowercase();
    let text = one_line(&full);
    let hint = if lower.contains("permission") || lower.contains("not permitted") || lower.contains("eperm") {
        " (needs root, or CAP_BPF and CAP_PERFMON)"
    } else if lower.contains("not implemented") || lower.contains("invalid argument") {
        " (needs Linux 5.15 or later with BPF and its BTF)"
    } else {
        ""
    };
    Refused { why: format!("{what}: {text}{hint}") }
}

/// A refusal is said in one line, but the kernel's verifier explains
/// itself in thousands (16 MB for a program over its instruction limit):
/// keep what precedes its log and the log's verdict, the last line before
/// its closing statistics.
fn one_line(text: &str) -> String {
    const LOG: &str = "Verifier output:";
    let Some(at) = text.find(LOG) else { return text.lines().next().unwrap_or("").to_string() };
    let head = text[..at].trim_end().trim_end_matches('.');
    let stats = |l: &str| ["verification time", "processed ", "stack depth", "func#", "Func#"].iter().any(|p| l.starts_with(p));
    let verdict = text[at + LOG.len()..].lines().map(str::trim).rfind(|l| !l.is_empty() && !stats(l)).unwrap_or("");
    let mut line = if verdict.is_empty() { head.to_string() } else { format!("{head}; the verifier said: {verdict}") };
    if line.len() > 300 {
        let cut = (0..=297).rev().find(|&i| line.is_char_boundary(i)).unwrap_or(0);
        line.truncate(cut);
        line.push_str("...");
    }
    line
}

pub use crate::counts::ProgramCost;

/// The fastest its perf events fire: a period of 10 µs.
pub const MAX_RATE_HZ: f64 = 100_000.0;

pub struct KernelSampler {
    // Dropping `bpf` detaches every event and frees the maps.
    bpf: Ebpf,
    targets: HashMap<MapData, u32, TargetConfig>,
    threads: HashMap<MapData, u32, ThreadEntry>,
    settings: Array<MapData, Settings>,
    counts: PerCpuArray<MapData, u64>,
    ring: RingBuf<MapData>,
    /// `--native`: host tid → the user registers it last left its CPU with.
    left: HashMap<MapData, u32, Left>,
    /// `--async`: per target, where its tasks are and how to copy them.
    tasks_targets: HashMap<MapData, u32, TasksTarget>,
    plans: HashMap<MapData, PlanKey, Plan>,
    /// One perf event per online CPU: (cpu, its link).
    links: Vec<(u32, PerfEventLinkId)>,
    rate_hz: f64,
    /// `--native`: the program copies registers and stack with each record.
    native: Option<crate::native::NativeOptions>,
    /// `--mode wall`: the switch program takes a record as a thread leaves its CPU.
    switch_records: bool,
    /// `--async`: the program copies each record's task graph too.
    tasks: bool,
    /// `--native`: reads the registers a thread asleep since before the
    /// program ran saved; or why the kernel refused the iterator.
    saved_regs: Option<Result<super::saved_regs::SavedRegs, String>>,
    /// Keeps `kernel.bpf_stats_enabled` on while we run (None: refused).
    _stats: Option<OwnedFd>,
}

/// The ring's size under `--native` (a power of two): 64 MiB.
const NATIVE_RING_BYTES: u32 = 64 << 20;

fn program(native: &Option<crate::native::NativeOptions>, tasks: bool) -> &'static str {
    match (native.is_some(), tasks) {
        (true, _) => "capture_native",
        (false, true) => "capture_tasks",
        (false, false) => "capture",
    }
}

fn period_ns(rate_hz: f64) -> u64 {
    ((1e9 / rate_hz).round() as u64).max((1e9 / MAX_RATE_HZ) as u64)
}

/// How soon after its last switch record a thread's switch-out is recorded
/// again: its CPU time for them is bounded, however often it switches (one
/// preempted 50,000 times a second would otherwise cost a record at each).
/// Half a period, but no more than a millisecond unless an eighth of the
/// period is more: below 500 Hz, half a period left unrecorded every run
/// cut short. At 100 Hz over 16 spinning processes that was 13 switch-outs
/// a second whose off period a tick fell in, each then read from user
/// space (about 20 records' cost, and racing the thread's return), the
/// largest part of the agent's work. At most 1,000 records a second per
/// thread below 500 Hz, 2 a period above.
fn switch_gap_ns(rate_hz: f64) -> u64 {
    let period = period_ns(rate_hz);
    (period / 2).min((period / 8).max(1_000_000)).max(1)
}

fn attach(prog: &mut PerfEvent, cpu: u32, rate_hz: f64) -> Result<PerfEventLinkId, Refused> {
    prog.attach(
        PerfTypeId::Software,
        perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK as u64,
        PerfEventScope::AllProcessesOneCpu { cpu },
        SamplePolicy::Period(period_ns(rate_hz)),
        false,
    )
    .map_err(|e| refused(&format!("perf event on CPU {cpu}"), e))
}

/// Load program `name` and attach it to raw tracepoint `point`.
fn attach_raw(bpf: &mut Ebpf, name: &str, point: &str) -> Result<(), Refused> {
    let sw: &mut RawTracePoint = bpf
        .program_mut(name)
        .ok_or_else(|| Refused { why: format!("BPF object has no {name} program") })?
        .try_into()
        .map_err(|e| refused("BPF program type", e))?;
    sw.load().map_err(|e| refused(&format!("the kernel refused the BPF program {name}"), e))?;
    sw.attach(point).map_err(|e| refused(&format!("attaching to {point}"), e))?;
    Ok(())
}

impl KernelSampler {
    /// Load and attach at `rate_hz` per CPU; with `native`, the program
    /// that copies each sampled thread's registers and stack too. Any
    /// refusal (no rights, no BPF, an old kernel, a verifier that
    /// disagrees) is a [`Refused`], never a panic. With `switch_records`
    /// (`--mode wall` without `--native`), a thread's record is also taken
    /// as it leaves its CPU (`off_cpu::Switched`). With `tasks` (`--async`;
    /// not with `--native`), each record carries the thread's task graph.
    pub fn open(rate_hz: f64, native: Option<crate::native::NativeOptions>, switch_records: bool, tasks: bool) -> Result<KernelSampler, Refused> {
        if !(rate_hz.is_finite() && rate_hz > 0.0) {
            return Err(Refused { why: format!("rate {rate_hz} Hz") });
        }
        // Before loading: run times are counted only while stats are on.
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        let mut loader = EbpfLoader::new();
        if native.is_some() {
            let cpus = aya::util::nr_cpus().map_err(|(what, e)| refused(what, e))?;
            // A slot per CPU, indexed by the CPU the program runs on; and
            // room for a drain's worth of records some 64 KiB larger.
            loader.set_max_entries("NATIVE_SCRATCH", cpus as u32).set_max_entries("RECORDS", NATIVE_RING_BYTES);
        } else {
            // Unused: no need for its 65,536 preallocated entries.
            loader.set_max_entries("LEFT", 64);
        }
        if tasks && native.is_none() {
            let cpus = aya::util::nr_cpus().map_err(|(what, e)| refused(what, e))?;
            loader.set_max_entries("TASKS_SCRATCH", cpus as u32);
        } else {
            loader.set_max_entries("PLANS", 1).set_max_entries("TASKS_CFG", 1);
        }
        let mut bpf = loader.load(OBJECT).map_err(|e| refused("loading the BPF program", e))?;
        let tasks = tasks && native.is_none();
        let native_wall = native.is_some();
        let prog: &mut PerfEvent = bpf
            .program_mut(program(&native, tasks))
            .ok_or_else(|| Refused { why: "BPF object has no capture program".into() })?
            .try_into()
            .map_err(|e| refused("BPF program type", e))?;
        let why =
            if tasks { "the kernel refused the BPF program that copies task graphs (--async needs Linux 5.17+)" } else { "the kernel refused the BPF program" };
        prog.load().map_err(|e| refused(why, e))?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| refused(what, e))?;
        let mut links = Vec::new();
        for cpu in cpus {
            links.push((cpu, attach(prog, cpu, rate_hz)?));
        }
        if native.is_some() || switch_records {
            attach_raw(&mut bpf, "switch_out", "sched_switch")?;
        }
        attach_raw(&mut bpf, "exec_seen", "sched_process_exec")?;
        let take = |bpf: &mut Ebpf, name: &str| bpf.take_map(name).ok_or_else(|| Refused { why: format!("BPF object has no map {name}") });
        let targets = HashMap::try_from(take(&mut bpf, "TARGETS")?).map_err(|e| refused("TARGETS", e))?;
        let threads = HashMap::try_from(take(&mut bpf, "THREADS")?).map_err(|e| refused("THREADS", e))?;
        let counts = PerCpuArray::try_from(take(&mut bpf, "COUNTS")?).map_err(|e| refused("COUNTS", e))?;
        let ring = RingBuf::try_from(take(&mut bpf, "RECORDS")?).map_err(|e| refused("RECORDS", e))?;
        let left = HashMap::try_from(take(&mut bpf, "LEFT")?).map_err(|e| refused("LEFT", e))?;
        let settings = Array::try_from(take(&mut bpf, "SETTINGS")?).map_err(|e| refused("SETTINGS", e))?;
        let tasks_targets = HashMap::try_from(take(&mut bpf, "TASKS_CFG")?).map_err(|e| refused("TASKS_CFG", e))?;
        let plans = HashMap::try_from(take(&mut bpf, "PLANS")?).map_err(|e| refused("PLANS", e))?;
        let mut k = KernelSampler {
            bpf,
            targets,
            threads,
            settings,
            counts,
            ring,
            left,
            tasks_targets,
            plans,
            links,
            rate_hz,
            native,
            switch_records,
            tasks,
            // Refused (before Linux 6.1, say), such a thread keeps /proc's
            // sp and ip only, as before.
            saved_regs: native_wall.then(|| super::saved_regs::SavedRegs::load(SAVED_REGS)),
            _stats: stats,
        };
        k.write_settings().map_err(|e| refused("SETTINGS", e))?;
        Ok(k)
    }

    /// SETTINGS for the rate in force.
    fn write_settings(&mut self) -> crate::error::Result<()> {
        let s =
            Settings { switch_gap_ns: if self.switch_records { switch_gap_ns(self.rate_hz) } else { 0 }, keep_regs: u32::from(self.native.is_some()), pad: 0 };
        self.settings.set(0, s, 0).map_err(|e| map_error("SETTINGS", e))
    }

    /// Whether a record is taken as each target thread leaves its CPU.
    pub fn switch_records(&self) -> bool {
        self.switch_records
    }

    /// Whether each record carries its thread's task graph (`--async`).
    pub fn tasks(&self) -> bool {
        self.tasks
    }

    /// `--async`: where target `pid`'s tasks are, and the fixed plans.
    pub fn set_tasks_target(&mut self, pid: u32, cfg: TasksTarget) -> crate::error::Result<()> {
        self.tasks_targets.insert(pid, cfg, 0).map_err(|e| map_error("TASKS_CFG", e))
    }

    /// `--async`: how objects of type `ty` in target `pid` are copied.
    pub fn set_plan(&mut self, pid: u32, ty: u64, plan: Plan) -> crate::error::Result<()> {
        self.plans.insert(PlanKey { tgid: pid, pad: 0, ty }, plan, 0).map_err(|e| map_error("PLANS", e))
    }

    /// `--async`: target `pid` and its types' plans out of the maps.
    pub fn remove_tasks(&mut self, pid: u32, types: impl Iterator<Item = u64>) {
        let _ = self.tasks_targets.remove(&pid);
        for ty in types {
            let _ = self.plans.remove(&PlanKey { tgid: pid, pad: 0, ty });
        }
    }

    /// `--native`'s options, when the program copies native stacks.
    pub fn native(&self) -> Option<&crate::native::NativeOptions> {
        self.native.as_ref()
    }

    pub fn rate_hz(&self) -> f64 {
        self.rate_hz
    }

    /// Fire at `rate_hz` from now on (the agent's CPU budget lowers it).
    /// Each CPU's event is replaced: a CPU misses at most one period.
    pub fn set_rate(&mut self, rate_hz: f64) -> Result<(), Refused> {
        if !(rate_hz.is_finite() && rate_hz > 0.0) || period_ns(rate_hz) == period_ns(self.rate_hz) {
            return Ok(());
        }
        let prog: &mut PerfEvent = self
            .bpf
            .program_mut(program(&self.native, self.tasks))
            .ok_or_else(|| Refused { why: "BPF object has no capture program".into() })?
            .try_into()
            .map_err(|e| refused("BPF program type", e))?;
        for (cpu, link) in self.links.iter_mut() {
            let new = attach(prog, *cpu, rate_hz)?;
            let old = std::mem::replace(link, new);
            let _ = prog.detach(old);
        }
        self.rate_hz = rate_hz;
        self.write_settings().map_err(|e| refused("SETTINGS", e))
    }

    pub fn set_target(&mut self, pid: u32, cfg: TargetConfig) -> crate::error::Result<()> {
        self.targets.insert(pid, cfg, 0).map_err(|e| map_error("TARGETS", e))
    }

    pub fn remove_target(&mut self, pid: u32) {
        let _ = self.targets.remove(&pid);
    }

    /// `--native`: the user registers host thread `tid` saved as it last
    /// entered the kernel, from the task iterator (a thread off CPU: those
    /// it will leave with); None where the iterator is refused.
    pub fn saved_regs(&self, tid: u32) -> Option<crate::stack::Regs> {
        self.saved_regs.as_ref()?.as_ref().ok()?.of(tid)
    }

    /// `--native`: why threads asleep since before the program ran keep
    /// /proc's sp and ip only, if they do.
    pub fn saved_regs_refused(&self) -> Option<&str> {
        self.saved_regs.as_ref()?.as_ref().err().map(String::as_str)
    }

    /// `--native`: the user registers host thread `tid` last left its CPU
    /// with (ip, sp, bp), if it did so while the program ran.
    pub fn left_cpu_with(&self, tid: u32) -> Option<crate::stack::Regs> {
        let l = self.left.get(&tid, 0).ok()?;
        Some(crate::stack::Regs { ip: l.ip, sp: l.sp, bp: l.bp })
    }

    pub fn set_thread(&mut self, tid: u32, tstate: u64) -> crate::error::Result<()> {
        self.threads.insert(tid, ThreadEntry { tstate, switch_ns: 0 }, 0).map_err(|e| map_error("THREADS", e))
    }

    /// Out of THREADS, and its kept registers with it (LEFT is keyed by
    /// tid alone: a later thread given the same tid must not find them).
    pub fn remove_thread(&mut self, tid: u32) {
        let _ = self.threads.remove(&tid);
        self.forget_left(tid);
    }

    /// Drop the registers LEFT keeps for host thread `tid`.
    pub fn forget_left(&mut self, tid: u32) {
        let _ = self.left.remove(&tid);
    }

    /// Hand every record waiting in the ring to `f`, without blocking.
    /// Hand the ring's records to `f` until it is empty (true) or for
    /// `budget` at most (false: more may wait). Unbounded, a ring filled
    /// as fast as it was read held its reader here for good: no Ctrl-C,
    /// no end of the duration (bench/run.py, 50 kHz: killed after 18 s of
    /// a 3 s recording).
    pub fn drain(&mut self, budget: Duration, mut f: impl FnMut(&[u8])) -> bool {
        let start = Instant::now();
        let mut n = 0u32;
        while let Some(item) = self.ring.next() {
            f(&item);
            n = n.wrapping_add(1);
            if n % 64 == 0 && start.elapsed() >= budget {
                return false;
            }
        }
        true
    }

    pub fn cost(&self) -> ProgramCost {
        let mut c = ProgramCost::default();
        // Runs: the capture program's (its firings). Time: every loaded
        // program's, `--native`'s switch_out (at each context switch) too,
        // since all of it is the sampler's cost. Before, the first loaded
        // program found gave both, under `--native` either of the two.
        if let Some(info) = self.bpf.program(program(&self.native, self.tasks)).and_then(|p| p.info().ok()) {
            c.runs = info.run_count();
        }
        c.run_time = self.bpf.programs().filter_map(|(_, p)| p.info().ok()).map(|i| i.run_time()).sum();
        let sum = |i: u32| self.counts.get(&i, 0).map(|v| v.iter().sum::<u64>()).unwrap_or(0);
        c.hits = sum(0);
        c.lost = sum(1);
        c.in_exec = sum(2);
        c
    }
}

fn map_error(map: &str, e: aya::maps::MapError) -> crate::error::Error {
    crate::error::Error::Corrupt(format!("BPF map {map}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verifier's log is cut to its verdict; other errors to their first line.
    #[test]
    fn a_refusal_is_one_line_with_the_verifiers_verdict() {
        let log = format!(
            "the BPF_PROG_LOAD syscall failed. Verifier output: 0: R1=ctx() R10=fp0\n{}266: (2d) if r2 > r3 goto pc+249\nBPF program is too large. Processed 1000001 insn\nverification time 9145620 usec\nstack depth 168+0\nprocessed 1000001 insns (limit 1000000) max_states_per_insn 21\n",
            "12: (85) call bpf_probe_read_user#112\n".repeat(10_000)
        );
        let r = refused("the kernel refused the BPF program switch_out", log);
        assert_eq!(
            r.why,
            "the kernel refused the BPF program switch_out: the BPF_PROG_LOAD syscall failed; the verifier said: BPF program is too large. Processed 1000001 insn"
        );
        let r = refused("loading the BPF program", "Operation not permitted (os error 1)\nmore");
        assert_eq!(r.why, "loading the BPF program: Operation not permitted (os error 1) (needs root, or CAP_BPF and CAP_PERFMON)");
    }

    /// Half a period at 500 Hz and above; below, an eighth of the period
    /// but at least a millisecond, so never more records than 1,000 a
    /// second per thread, nor fewer chances than before.
    #[test]
    fn switch_gap_is_half_a_period_or_at_most_a_millisecond_below_500_hz() {
        let ms = 1_000_000;
        assert_eq!(switch_gap_ns(10_000.0), 50_000);
        assert_eq!(switch_gap_ns(1_000.0), ms / 2);
        assert_eq!(switch_gap_ns(500.0), ms);
        assert_eq!(switch_gap_ns(250.0), ms);
        assert_eq!(switch_gap_ns(100.0), 1_250_000);
        assert_eq!(switch_gap_ns(1.0), 125 * ms);
        for hz in [1.0, 7.0, 99.0, 100.0, 333.0, 499.0, 500.0, 501.0, 1e3, 5e3, 1e4, 5e4] {
            let (gap, period) = (switch_gap_ns(hz), period_ns(hz));
            assert!(gap <= period / 2 && gap >= 1, "{hz} Hz: gap {gap} of a {period}-ns period");
            assert!(gap >= (period / 8).min(period / 2), "{hz} Hz: gap {gap}");
        }
    }
}
