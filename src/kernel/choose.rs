//! Which sampler a recording uses: `--sampler auto` takes the kernel
//! sampler where it can do what was asked and the kernel allows it, and
//! says in one line why not when it was asked for or refused.

use crate::sampler::Mode;

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
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    pub mode: Mode,
    pub rate_hz: f64,
    pub native: bool,
    pub asyncio: bool,
    pub thread_filter: bool,
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
    [
        (w.native, "--native is not supported by it"),
        (w.asyncio, "--async is not supported by it"),
        (w.thread_filter, "--thread/--main-thread are not supported by it"),
    ]
    .into_iter()
    .find_map(|(on, why)| on.then_some(why))
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
            match KernelSampler::open(w.rate_hz) {
                Ok(k) => (Some(k), None),
                Err(r) => (None, note(&r.why)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(mode: Mode, rate_hz: f64) -> Wanted {
        Wanted { mode, rate_hz, native: false, asyncio: false, thread_filter: false }
    }

    /// What auto passes over for ptrace, before the kernel is asked: the
    /// options it cannot do, and rates its perf events cannot fire at
    /// (taken, they were silently capped at 100 kHz).
    #[test]
    fn auto_passes_over_what_only_ptrace_can_do() {
        assert_eq!(unsupported(&wanted(Mode::Cpu, 100_000.0)), None);
        assert!(unsupported(&wanted(Mode::Cpu, 1_000_000.0)).is_some_and(|w| w.contains("100 kHz")));
        assert!(unsupported(&wanted(Mode::Exception, 100.0)).is_some());
        for w in [
            Wanted { native: true, ..wanted(Mode::Cpu, 100.0) },
            Wanted { asyncio: true, ..wanted(Mode::Cpu, 100.0) },
            Wanted { thread_filter: true, ..wanted(Mode::Cpu, 100.0) },
        ] {
            assert!(unsupported(&w).is_some(), "{w:?}");
            // Asked for by name, refused with why; under auto, silently ptrace.
            assert!(choose(SamplerChoice::Kernel, &w).1.is_some_and(|n| n.contains("not supported")));
            assert!(choose(SamplerChoice::Auto, &w).1.is_none());
        }
    }
}
