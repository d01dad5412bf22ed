use clap::Parser;
use clap::error::ErrorKind;

fn main() {
    let cli = match pyprof::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) => e.exit(),
        Err(e) => {
            // clap's report spans several lines (usage, hints); bad input gets one.
            let text = e.to_string();
            let line: Vec<&str> =
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")).collect();
            eprintln!("pyprof: {}", line.join(" ").trim_start_matches("error: "));
            std::process::exit(2);
        }
    };
    raise_open_file_limit();
    match pyprof::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the whole context chain, outermost first.
            eprintln!("pyprof: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Following a thread can take a descriptor or a few (`--mode cpu`'s perf
/// events, one per thread and CPU; kept `/proc` files): a 1,000-thread
/// target needs more than the usual soft limit of 1,024. The hard limit is
/// ours to take; past it, threads are read the slower way.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max.min(1 << 20);
        // SAFETY: valid pointer; failure leaves the limit as it was.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}
