//! How often the context-switch tracker (`process::run_states`) and `/proc`
//! disagree about which threads of a process are on a CPU: each tick polls
//! the tracker, then for every thread takes its answer and a `/proc` read
//! right after it. A thread that switched between the two reads disagrees
//! honestly; so does one woken but not yet on a CPU, which `/proc` calls 'R'
//! and the tracker (which sees no wakeups) 'S' until it runs.
//!
//!     python3 bench/threads_target.py 1000 4 &     # prints "ready"
//!     cargo run --release --example run_states_check -- PID [TICKS] [HZ]

use std::time::{Duration, Instant};

use pyprof::process::run_states::RunStates;
use pyprof::process::task_state;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(pid) = args.first().and_then(|s| s.parse::<i32>().ok()) else {
        eprintln!("usage: run_states_check PID [TICKS=300] [HZ=100]");
        std::process::exit(2);
    };
    let ticks: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(300);
    let hz: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100.0);
    let started = Instant::now();
    let mut rs = match RunStates::open(pid) {
        Ok(rs) => rs,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!("opened for {} threads in {:.1} ms", rs.threads(), started.elapsed().as_secs_f64() * 1e3);
    let (mut asked, mut tracker_r, mut proc_r) = (0u64, 0u64, 0u64);
    // (tracker, /proc) pairs that differ, by kind.
    let mut differ: std::collections::BTreeMap<(char, char), u64> = Default::default();
    let (mut poll_time, mut ask_time) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..ticks {
        let t0 = Instant::now();
        rs.poll();
        poll_time += t0.elapsed();
        let tids: Vec<i32> =
            std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()).unwrap_or_default();
        if tids.is_empty() {
            break;
        }
        for tid in tids {
            let t1 = Instant::now();
            let ours = rs.track(tid);
            ask_time += t1.elapsed();
            let theirs = task_state(pid, tid);
            let (Some(ours), Some(theirs)) = (ours, theirs) else { continue };
            asked += 1;
            tracker_r += u64::from(ours == 'R');
            proc_r += u64::from(theirs == 'R');
            if (ours == 'R') != (theirs == 'R') {
                *differ.entry((ours, theirs)).or_default() += 1;
            }
        }
        std::thread::sleep(Duration::from_secs_f64(1.0 / hz));
    }
    let wrong: u64 = differ.values().sum();
    println!(
        "{ticks} ticks, {asked} answers: {wrong} disagree ({:.4} %); 'R' {tracker_r} by the tracker, {proc_r} by /proc",
        100.0 * wrong as f64 / asked.max(1) as f64
    );
    for ((ours, theirs), n) in &differ {
        println!("  tracker {ours:?}, /proc {theirs:?}: {n}");
    }
    println!(
        "poll {:.1} µs a tick, {:.0} ns an answer; {:?}",
        poll_time.as_secs_f64() * 1e6 / ticks as f64,
        ask_time.as_secs_f64() * 1e9 / asked.max(1) as f64,
        rs.take_counts()
    );
}
