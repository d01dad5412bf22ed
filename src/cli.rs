//! The command line (clap). Only this file knows about clap; it converts
//! arguments into the plain option structs the library takes.

use clap::{Args, Parser, Subcommand};

use crate::attach::AttachOptions;
use crate::binary::runtime::Method;

#[derive(Parser, Debug)]
#[command(name = "pyprof", version, about = "Sampling profiler for CPython 3.8-3.15 that never stops the target")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the Python stack of every thread of a running process, once.
    Dump(DumpArgs),
}

#[derive(Args, Debug)]
pub struct TargetArgs {
    /// Process id of the running Python program.
    #[arg(short, long)]
    pub pid: i32,

    /// Force one way of locating _PyRuntime: section, symbol or scan (for tests and debugging).
    #[arg(long, hide = true, env = "PYPROF_RUNTIME_METHOD")]
    pub runtime_method: Option<Method>,
}

impl TargetArgs {
    pub fn attach_options(&self) -> AttachOptions {
        AttachOptions { runtime_method: self.runtime_method }
    }
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Print one JSON object instead of text (schema in docs/formats.md).
    #[arg(long)]
    pub json: bool,

    /// Also print how pyprof attached (module, _PyRuntime method, offsets source).
    #[arg(short, long)]
    pub verbose: bool,
}
