//! The terminal while the view runs: raw mode and the alternate screen,
//! given back on every way out (drop on return or error, and a panic hook
//! for panics on any thread, the sampler's included).

use std::io::Stdout;
use std::sync::Once;

use crossterm::execute;
use crossterm::terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

pub type Term = Terminal<CrosstermBackend<Stdout>>;

/// Owns the terminal; dropping it restores the terminal.
pub struct Guard {
    pub term: Term,
}

fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen, crossterm::cursor::Show);
}

impl Guard {
    pub fn enter() -> std::io::Result<Guard> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // First the terminal, so the panic's message is readable.
                restore();
                previous(info);
            }));
        });
        enable_raw_mode()?;
        let guard = |e: std::io::Error| {
            restore();
            e
        };
        execute!(std::io::stdout(), EnterAlternateScreen, crossterm::cursor::Hide).map_err(guard)?;
        let term = Terminal::new(CrosstermBackend::new(std::io::stdout())).map_err(guard)?;
        Ok(Guard { term })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}
