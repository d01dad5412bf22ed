//! pyprof: an out-of-process sampling profiler for CPython 3.8–3.15.
//!
//! Data flow: a pid becomes a [`process::Target`] (existence, permission,
//! `/proc/PID/root`); [`attach`] finds the interpreter module in the maps,
//! opens its ELF through the target's root, locates `_PyRuntime`
//! ([`binary::runtime`]: section, symbol, data scan), reads the exact version
//! ([`binary::version`]) and builds validated [`offsets::Offsets`] from
//! `offsets/*.toml` or the target's `_Py_DebugOffsets`. A [`session::Session`]
//! then walks interpreters → thread states ([`python::threads`]) → frames
//! ([`python::frames`]) → code objects ([`python::code`], cached) and maps each
//! instruction to a line ([`python::linetable`]). All reads go through
//! [`process::memory::RemoteMemory`] (`process_vm_readv`). So that each
//! sample is one instant, the thread that holds the GIL is held
//! still for the length of the read (ptrace, a few microseconds) unless it
//! is proven off CPU; `--nonblocking` never stops anything and `--native`
//! stops every Python thread for its sample (docs/sampling.md).

pub mod acquire;
pub mod agent;
pub mod attach;
pub mod binary;
pub mod cli;
pub mod counts;
pub mod diff;
pub mod dump;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod kernel;
pub mod native;
pub mod offsets;
pub mod output;
pub mod postmortem;
pub mod process;
pub mod profile;
pub mod python;
pub mod record;
pub mod report;
pub mod sampler;
pub mod session;
pub mod stack;
pub mod thread_filter;
pub mod top;

use cli::{Cli, Command};

/// Runs one command; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Dump(args) => dump::run(&args.into_config()),
        Command::Record(args) => record::run(&args.into_config()?),
        Command::Diff(args) => diff::run(&args.into_config()?),
        Command::Report(args) => report::run(&args.into_config()?),
        Command::Top(args) => top::run(&args.into_config()?),
        // The push exporters (agent::push) are wired in here when they exist.
        Command::Agent(args) => {
            let cfg = args.into_config()?;
            // Before the exporters start their threads: all must inherit it.
            agent::reload::hold_sighup();
            agent::run(&cfg, agent::push::exporters(&cfg.push)?)
        }
    }
}
