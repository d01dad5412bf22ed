//! `top` without a terminal (stdout is a pipe or a file): one plain table
//! per refresh, for logs, until sampling ends.

use std::io::Write;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::cpu::CpuMeter;
use super::feed::Msg;
use super::model::{Model, Selection};
use super::screen::{About, Screen, SortBy};
use crate::sampler::{SamplerStats, StopReason};

pub fn run(rx: Receiver<Msg>, about: &About, rows: usize, refresh: Duration) -> Result<Option<StopReason>, super::TopError> {
    let mut model = Model::new();
    let mut stats = SamplerStats::default();
    let mut cpu = CpuMeter::new();
    cpu.sample(&[about.pid]);
    let mut next = Instant::now() + refresh;
    let out = std::io::stdout();
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        let ended = match rx.recv_timeout(wait) {
            Ok(Msg::Batch(b)) => {
                model.ingest(&b);
                stats = b.stats;
                None
            }
            Ok(Msg::End(b, reason)) => {
                model.ingest(&b);
                stats = b.stats;
                Some(Some(reason))
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(None),
        };
        if ended.is_some() || Instant::now() >= next {
            let screen = Screen::build(&model, Selection::All, false, &stats, cpu.sample(&super::pids(&model, about.pid)), refresh, None);
            let mut w = out.lock();
            // Nobody reads any more (`| head`): stop, as top would on Ctrl-C.
            if write!(w, "{}", table(&screen, about, rows, ended.flatten())).and_then(|_| w.flush()).is_err() {
                return Ok(ended.flatten());
            }
            model.end_interval();
            // After a stall (a slow reader) the next table comes a refresh later, not in a burst.
            let now = Instant::now();
            next = if next + refresh > now { next + refresh } else { now + refresh };
        }
        if let Some(reason) = ended {
            return Ok(reason);
        }
    }
}

/// The header line, the column line and the `rows` heaviest rows by own share.
pub fn table(s: &Screen, about: &About, rows: usize, ended: Option<StopReason>) -> String {
    let mut t = format!("pyprof top · {} · threads {} · {} · errors: {}", s.target_text(about), s.threads, s.shares_text(), s.errors_text());
    if let Some(r) = ended {
        t.push_str(&format!(" · {}", r.describe()));
    }
    t.push('\n');
    t.push_str(&format!("{:>6}  {:>6}  {:>8}  {:>8}  FUNCTION\n", "OWN%", "TOTAL%", "OWN s", "TOTAL s"));
    for r in s.visible(SortBy::Own, "").into_iter().take(rows) {
        t.push_str(&format!("{:6.1}  {:6.1}  {:8.2}  {:8.2}  {}\n", s.pct(r.own), s.pct(r.total), s.secs(r.own), s.secs(r.total), s.label(about, &r.key)));
    }
    t.push('\n');
    t
}
