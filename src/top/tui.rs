//! The live view's loop on the main thread: take the sampler's batches
//! as they come (never making it wait), rebuild the screen once per
//! refresh unless paused, draw, and hand keys to [`Ui`].

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use crossterm::event::{self, Event};
use ratatui::layout::Rect;

use super::cpu::CpuMeter;
use super::feed::Msg;
use super::keys::{Action, Ui};
use super::model::Model;
use super::screen::{About, Screen};
use super::term::Guard;
use super::view;
use crate::sampler::{SamplerStats, StopReason};

/// How the view ended.
pub struct Outcome {
    /// Why sampling stopped, if it stopped before the view was quit.
    pub reason: Option<StopReason>,
}

pub fn run(rx: Receiver<Msg>, about: &About, refresh: Duration) -> Result<Outcome, super::TopError> {
    let mut guard = Guard::enter()?;
    let mut model = Model::new();
    let mut ui = Ui::default();
    let mut stats = SamplerStats::default();
    let mut cpu = CpuMeter::new();
    cpu.sample(&[about.pid]);
    let mut cpu_share = None;
    let mut reason: Option<StopReason> = None;
    let mut ended: Option<String> = None;
    let build =
        |model: &Model, ui: &Ui, stats: &SamplerStats, cpu: Option<f64>| Screen::build(model, ui.thread, ui.lines, stats, cpu, refresh, ui.detail.as_ref());
    let mut screen = Screen::default();
    let mut next = Instant::now() + refresh;
    let mut dirty = true;
    loop {
        let mut fresh_end = false;
        loop {
            match rx.try_recv() {
                Ok(Msg::Batch(b)) => {
                    model.ingest(&b);
                    stats = b.stats;
                }
                Ok(Msg::End(b, r)) => {
                    model.ingest(&b);
                    stats = b.stats;
                    reason = Some(r);
                    fresh_end = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if ended.is_none() && reason.is_none() {
                        ended = Some("sampling stopped".into());
                        ui.ended = true;
                        dirty = true;
                    }
                    break;
                }
            }
        }
        if fresh_end {
            match reason {
                // SIGINT or SIGTERM to pyprof: nobody is looking, go.
                Some(StopReason::Interrupted) => break,
                Some(r) => ended = Some(r.describe().to_string()),
                None => {}
            }
            ui.ended = true;
            if !ui.paused {
                screen = build(&model, &ui, &stats, cpu_share);
            }
            dirty = true;
        }
        // The first batch comes in a quarter of a second: shown at once, not a refresh later.
        if screen.ticks == 0 && model.ticks > 0 && !ui.paused {
            screen = build(&model, &ui, &stats, cpu_share);
            dirty = true;
        }
        let now = Instant::now();
        if now >= next && ended.is_none() {
            cpu_share = cpu.sample(&super::pids(&model, about.pid));
            if !ui.paused {
                screen = build(&model, &ui, &stats, cpu_share);
                dirty = true;
            }
            model.end_interval();
            next = now + refresh;
        }
        if dirty {
            guard.term.draw(|f| view::draw(f, about, &screen, &ui, ended.as_deref()))?;
            dirty = false;
        }
        if !event::poll(Duration::from_millis(50))? {
            continue;
        }
        match event::read()? {
            Event::Key(k) => {
                let visible = screen.visible(ui.sort, &ui.filter);
                let selected = visible.get(ui.selected).map(|r| r.key.clone());
                let size = guard.term.size()?;
                let page = view::page(Rect::new(0, 0, size.width, size.height));
                let n = visible.len();
                let related: Vec<_> = screen.detail.iter().flat_map(|d| d.callers.iter().chain(&d.callees)).map(|r| r.key.clone()).collect();
                match ui.key(k, &screen.thread_list, n, page, selected.as_ref(), &related) {
                    Action::Quit => break,
                    Action::Nothing => {}
                    Action::Redraw => dirty = true,
                    Action::Rebuild => {
                        screen = build(&model, &ui, &stats, cpu_share);
                        dirty = true;
                    }
                    Action::Reset => {
                        model.reset();
                        screen = build(&model, &ui, &stats, cpu_share);
                        dirty = true;
                    }
                }
                ui.clamp(screen.visible(ui.sort, &ui.filter).len());
            }
            Event::Resize(..) => dirty = true,
            _ => {}
        }
    }
    Ok(Outcome { reason })
}
