use clap::Parser;

fn main() {
    let cli = pyprof::cli::Cli::parse();
    if let Err(e) = pyprof::run(cli) {
        // One line: the whole context chain, outermost first.
        eprintln!("pyprof: {e:#}");
        std::process::exit(1);
    }
}
