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
    match pyprof::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the whole context chain, outermost first.
            eprintln!("pyprof: {e:#}");
            std::process::exit(1);
        }
    }
}
