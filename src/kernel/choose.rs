//! Which sampler a recording uses: `--sampler auto` takes the kernel
//! sampler where it can do what was asked and the kernel allows it, and
//! says in one line why not when it was asked for or refused.

use crate::python::asyncio::AsyncMode;
use crate::sampler::Mode;

use crate::session::{Sampling, SessionOptions};

use super::loader::{KernelSampler, MAX_RATE_HZ};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SamplerChoice {
    /// The kernel sampler where allowed, else ptrace.
    #[default]
    Auto,
    Kernel,
    /// Stop the GIL holder for each read (exact).
    Ptrace,
    /// Never stop anything; torn reads counted.
    Nonblocking,
}

/// What the recording asks for that the kernel sampler must support.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub mode: Mode,
    pub rate_hz: f64,
    pub native: Option<crate::native::NativeOptions>,
    pub asyncio: Option<AsyncMode>,
}

impl Wanted {
    pub fn of(mode: Mode, rate_hz: f64, attach: &SessionOptions) -> Wanted {
        Wanted { mode, rate_hz, native: attach.native.clone(), asyncio: attach.asyncio }
    }
}

/// Why the kernel sampler cannot do this recording, if it cannot.
fn unsupported(w: &Wanted) -> Option<&'static str> {
    if w.rate_hz > MAX_RATE_HZ {
        return Some("rates above 100 kHz are not supported by it");
    }
    match w.mode {
        Mode::Cpu | Mode::Gil => {}
        // Its threads on no CPU are read from user space, proven off CPU
        // by the CPU-wide context-switch records (`kernel::off_cpu`).
        Mode::Wall if !crate::process::occupancy::available() => {
            return Some("--mode wall needs CPU-wide context-switch events, which the kernel refuses here");
        }
        Mode::Wall => {}
        Mode::Exception => return Some("--mode exception is not supported by it"),
    }
    // Every pending task at every tick would be a copy of the whole graph
    // at each interrupt; the running task's chain is what it copies.
    (w.asyncio == Some(AsyncMode::All)).then_some("--async=all is not supported by it (--async is)")
}

/// The kernel sampler, loaded and attached, or None (ptrace then); with
/// `--sampler kernel` or a refusal by the kernel, the line that says why.
/// The caller says it once the target is attached: a target that cannot
/// be (no such pid, no rights) is then one line, its own error.
pub fn choose(choice: SamplerChoice, w: &Wanted) -> (Option<KernelSampler>, Option<String>) {
    let note = |why: &str| Some(format!("kernel sampler not used ({why}); sampling with ptrace"));
    match choice {
        SamplerChoice::Ptrace | SamplerChoice::Nonblocking => (None, None),
        SamplerChoice::Auto | SamplerChoice::Kernel => {
            if let Some(why) = unsupported(w) {
                return (None, if choice == SamplerChoice::Kernel { note(why) } else { None });
            }
            // Wall mode's records at switch-outs carry no task graph: with
            // --async, a thread off CPU is read from user space instead.
            let switch_records = w.mode == Mode::Wall && w.native.is_none() && w.asyncio.is_none();
            match KernelSampler::open(w.rate_hz, w.native.clone(), switch_records, w.asyncio.is_some()) {
                Ok(k) => (Some(k), None),
                Err(r) => (None, note(&r.why)),
            }
        }
    }
}

/// [`choose`] for sessions attached with `attach`: also the options to
/// attach them with. Under the kernel sampler nothing is stopped: no probe
/// stop at the attach, wall mode's user-space half reads threads proven
/// off CPU lock-free, and `--native` is the program's, not the session's.
pub fn for_sessions(choice: SamplerChoice, mode: Mode, rate_hz: f64, attach: &SessionOptions) -> (Option<KernelSampler>, SessionOptions, Option<String>) {
    let (kernel, note) = choose(choice, &Wanted::of(mode, rate_hz, attach));
    let attach = match kernel {
        Some(_) => SessionOptions { sampling: Sampling::Nonblocking, native: None, eval_groups: attach.native.is_some(), ..attach.clone() },
        None => attach.clone(),
    };
    (kernel, attach, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(mode: Mode, rate_hz: f64) -> Wanted {
        Wanted { mode, rate_hz, native: None, asyncio: None }
    }

    /// What auto passes over for ptrace, before the kernel is asked: the
    /// options it cannot do, and rates its perf events cannot fire at
    /// (taken, they were silently capped at 100 kHz).
    #[test]
    fn auto_passes_over_what_only_ptrace_can_do() {
        assert_eq!(unsupported(&wanted(Mode::Cpu, 100_000.0)), None);
        assert!(unsupported(&wanted(Mode::Cpu, 1_000_000.0)).is_some_and(|w| w.contains("100 kHz")));
        assert!(unsupported(&wanted(Mode::Exception, 100.0)).is_some());
        assert_eq!(unsupported(&Wanted { asyncio: Some(AsyncMode::Running), ..wanted(Mode::Wall, 100.0) }), None);
        let w = Wanted { asyncio: Some(AsyncMode::All), ..wanted(Mode::Cpu, 100.0) };
        assert!(unsupported(&w).is_some(), "{w:?}");
        // Asked for by name, refused with why; under auto, silently ptrace.
        assert!(choose(SamplerChoice::Kernel, &w).1.is_some_and(|n| n.contains("not supported")));
        assert!(choose(SamplerChoice::Auto, &w).1.is_none());
        // --native is the program's own, in every mode it has.
        for mode in [Mode::Wall, Mode::Cpu, Mode::Gil] {
            assert_eq!(unsupported(&Wanted { native: Some(Default::default()), ..wanted(mode, 1000.0) }), None);
        }
    }
}
