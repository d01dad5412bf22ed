//! What taking samples did, counted: one type for every part of the path
//! (the acquirer, the walk, the code cache, the prefetcher, the task
//! graphs, the native unwinder, the run-state tracker). Each part counts
//! into its own `Counters` and hands them over when the snapshot is done
//! ([`Counters::take`]); a snapshot returns them with its stacks, and a
//! recording adds them up with `+=`. Nothing is pulled through getters,
//! and no field needs a hand-written `add`.

use std::time::Duration;

/// What the kernel sampler's eBPF program has cost so far, from the
/// kernel's BPF statistics (here, not in `kernel`: the sampler's stats and
/// the agent's metrics carry it without depending on the loader).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProgramCost {
    /// Runs of the program (every tick of every CPU, target or not).
    pub runs: u64,
    pub run_time: Duration,
    /// Ticks that hit a target thread, and records lost to a full ring.
    pub hits: u64,
    pub lost: u64,
    /// Ticks that hit a target thread inside execve, not taken.
    pub in_exec: u64,
}

/// How samples were taken: one snapshot's counts, or a recording's sum.
/// Fields are grouped by the part that counts them; a part leaves the
/// others at zero.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, derive_more::AddAssign)]
pub struct Counters {
    // -- acquire: how each snapshot was made one instant.
    /// Read while the GIL holder was held stopped.
    pub stopped: u64,
    /// Read while the target ran and no thread held the GIL.
    pub gil_free: u64,
    /// Of those, read again because the GIL changed hands under the first
    /// read: their instant is a few microseconds later than the tick's.
    pub moved: u64,
    /// Of the stopped ones, read again after stepping the held thread a few
    /// instructions out of a half-done frame update.
    pub stepped: u64,
    /// `--nonblocking`: read while the target ran, whatever it did.
    pub lock_free: u64,
    /// Of the stopped ones, those whose blocked threads were read just
    /// before the stop, proven unchanged through it.
    pub read_ahead: u64,
    /// Read with the GIL holder not stopped: it was on no CPU from before
    /// the read to after it, as its context-switch records prove.
    pub off_cpu: u64,
    /// Reads whose unstopped holder got a CPU meanwhile (or was caught
    /// halfway through a frame update): read again with it stopped.
    pub ran: u64,
    /// Thread stacks that moved while read (`--nonblocking` only).
    pub torn: u64,
    /// Snapshots put off to a later tick: a holder halfway through a frame
    /// update waited for a CPU to step on or to stop.
    pub deferred: u64,
    /// Of the stopped ones, those whose holder was read frozen: interrupted,
    /// then proven on no CPU by its records before its stop was reported.
    pub frozen: u64,
    /// Of the stopped ones, those whose holder neither stopped nor was
    /// proven off CPU within the stop's timeout, and was read running.
    pub unstopped: u64,
    /// Time the target had a thread held stopped, in total and at most.
    pub pause: Duration,
    pub pause_max: Longest,

    // -- python: what the walks read.
    /// Thread stacks walked (threads a filter leaves out are not), and the
    /// frames those walks read.
    pub threads_walked: u64,
    pub frames_walked: u64,
    /// Thread stacks carried over from the snapshot before, proven
    /// unchanged (`python::quiet`), and the snapshots that did so.
    pub carried: u64,
    pub carried_ticks: u64,
    /// The kernel sampler's wall mode: stacks of threads off CPU taken from
    /// the record made as each left its CPU (`kernel::off_cpu::Switched`),
    /// not read (carried over after that, they count as carried).
    pub from_switch_out: u64,
    /// Thread lists followed from a remembered head (`python::threads`).
    pub lists_by_head: u64,
    /// `process_vm_readv` calls and the bytes they returned.
    pub syscalls: u64,
    pub bytes_read: u64,
    /// Reads served from this sample's one prefetching call, and not.
    pub prefetch_hits: u64,
    pub prefetch_misses: u64,

    // -- python::code: the code-object cache.
    pub code_hits: u64,
    pub code_misses: u64,
    pub code_stale: u64,
    /// Checks that had to go by the name (no `co_version`), and of those,
    /// names compiled into the interpreter: no read needed.
    pub code_name_checks: u64,
    pub code_static_names: u64,
    /// Hits proven by the code-object generation, without reading the object.
    pub code_generation_hits: u64,
    /// Hits on code objects compiled into the interpreter, not read either.
    pub code_static_hits: u64,
    /// Code objects read to check their fingerprint.
    pub code_reads: u64,

    // -- python::asyncio (`--async`).
    /// Thread samples rewritten as a task's await chain.
    pub task_samples: u64,
    /// Idle tasks sampled (`--async=all`).
    pub idle_task_samples: u64,
    /// Graphs that could not be read (the thread kept its plain stack).
    pub task_graph_errors: u64,
    /// Chains cut at a cycle or at their length bound.
    pub task_chains_cut: u64,

    // -- native (`--native`): how C stacks merged with Python ones.
    pub native_stacks: u64,
    pub native_merged: u64,
    pub native_truncated: u64,
    pub native_unmerged: u64,
    /// Samples whose thread could not be stopped in time (no native frames).
    pub native_no_registers: u64,

    // -- process::run_states (`--mode cpu`): thread states from switches.
    pub switch_records: u64,
    /// Records the kernel dropped for a full ring, and the full re-reads
    /// from `/proc` that followed.
    pub switch_records_lost: u64,
    pub switch_resyncs: u64,
    /// `/proc` reads of threads seen switching out without being preempted.
    pub switch_rechecks: u64,
    /// Threads that could not be followed (they read `/proc` each time).
    pub threads_not_followed: u64,
}

impl Counters {
    /// Hand over what was counted so far and start again from zero.
    pub fn take(&mut self) -> Counters {
        std::mem::take(self)
    }
}

/// A duration that adds up as the longest of those added.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Longest(pub Duration);

impl std::ops::AddAssign for Longest {
    fn add_assign(&mut self, o: Longest) {
        self.0 = self.0.max(o.0);
    }
}

impl Longest {
    pub fn note(&mut self, d: Duration) {
        self.0 = self.0.max(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_sums_counts_and_keeps_the_longest_pause() {
        let mut a =
            Counters { stopped: 2, frames_walked: 10, pause: Duration::from_micros(5), pause_max: Longest(Duration::from_micros(4)), ..Default::default() };
        let b = Counters { stopped: 1, code_reads: 3, pause: Duration::from_micros(9), pause_max: Longest(Duration::from_micros(9)), ..Default::default() };
        a += b;
        assert_eq!((a.stopped, a.frames_walked, a.code_reads), (3, 10, 3));
        assert_eq!(a.pause, Duration::from_micros(14));
        assert_eq!(a.pause_max.0, Duration::from_micros(9));
        a += Counters { pause_max: Longest(Duration::from_micros(1)), ..Default::default() };
        assert_eq!(a.pause_max.0, Duration::from_micros(9));
    }

    #[test]
    fn take_leaves_zero() {
        let mut a = Counters { native_stacks: 4, ..Default::default() };
        assert_eq!(a.take().native_stacks, 4);
        assert_eq!(a, Counters::default());
    }
}
