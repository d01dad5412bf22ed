//! Which sampler a recording uses: `--sampler auto` takes the kernel
//! sampler where it can do what was asked and the kernel allows it, and
//! says in one line why not when it was asked for or refused.

use crate::sampler::Mode;

use super::loader::KernelSampler;

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
    pub subprocesses: bool,
    pub thread_filter: bool,
}

/// Why the kernel sampler cannot do this recording, if it cannot.
fn unsupported(w: &Wanted) -> Option<&'static str> {
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
        (w.subprocesses, "--subprocesses is not supported by it"),
        (w.thread_filter, "--thread/--main-thread are not supported by it"),
    ]
    .into_iter()
    .find_map(|(on, why)| on.then_some(why))
}

/// The kernel sampler, loaded and attached, or None (ptrace then): with
/// `--sampler kernel` or a refusal by the kernel, one line on stderr says why.
pub fn choose(choice: SamplerChoice, w: &Wanted, quiet: bool) -> Option<KernelSampler> {
    let say = |why: &str| {
        if !quiet {
            eprintln!("pyprof: kernel sampler not used ({why}); sampling with ptrace");
        }
    };
    match choice {
        SamplerChoice::Ptrace | SamplerChoice::Nonblocking => None,
        SamplerChoice::Auto | SamplerChoice::Kernel => {
            if let Some(why) = unsupported(w) {
                if choice == SamplerChoice::Kernel {
                    say(why);
                }
                return None;
            }
            match KernelSampler::open(w.rate_hz) {
                Ok(k) => Some(k),
                Err(r) => {
                    say(&r.why);
                    None
                }
            }
        }
    }
}
