//! What the keys do to the view's state. Only state changes here: the
//! caller decides from the returned [`Action`] whether the model must be
//! asked again (thread, lines, unpause, reset) or a redraw is enough.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::model::{RowKey, Selection, ThreadInfo};
use super::screen::SortBy;

#[derive(Debug, Clone, Default)]
pub struct Ui {
    pub sort: SortBy,
    pub lines: bool,
    pub thread: Selection,
    pub filter: String,
    /// Typing a filter after `/`.
    pub typing: bool,
    pub paused: bool,
    /// Index into the visible rows.
    pub selected: usize,
    /// Callers and callees of this function are shown (Enter).
    pub detail: Option<RowKey>,
    /// The functions whose callers and callees were shown before, to go back to.
    pub detail_back: Vec<RowKey>,
    /// In the callers-and-callees view: the chosen entry, callers first.
    pub detail_cursor: usize,
    /// Sampling ended: the next key quits.
    pub ended: bool,
    /// The thread picker is open at this entry (0: all threads, i: the i-th thread).
    pub picking: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Redraw,
    /// Take a new screen from the model (a different slice of it, or unpaused).
    Rebuild,
    Reset,
    Quit,
}

impl Ui {
    /// `rows`: how many rows are visible now; `page`: how many fit on screen;
    /// `selected`: the function of the selected row, if any; `related`: the
    /// callers then the callees shown, in the callers-and-callees view.
    pub fn key(&mut self, k: KeyEvent, threads: &[ThreadInfo], rows: usize, page: usize, selected: Option<&RowKey>, related: &[RowKey]) -> Action {
        if k.kind == KeyEventKind::Release {
            return Action::Nothing;
        }
        let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl_c || self.ended {
            return Action::Quit;
        }
        if self.typing {
            return self.filter_key(k);
        }
        if let Some(at) = self.picking {
            return self.pick_key(k, at, threads);
        }
        if self.detail.is_some() {
            if let Some(a) = self.detail_key(k, related) {
                return a;
            }
        }
        let last = rows.saturating_sub(1);
        let page = page.max(1);
        match k.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.selected = 0;
            }
            KeyCode::Enter if self.detail.is_none() => match selected {
                Some(key) => {
                    self.detail = Some(key.function_row());
                    return Action::Rebuild;
                }
                None => return Action::Nothing,
            },
            KeyCode::Char(c @ '1'..='6') => self.sort = SortBy::ALL[(c as u8 - b'1') as usize],
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('/') => {
                self.typing = true;
                self.detail = None;
                self.detail_back.clear();
            }
            KeyCode::Char('p') => {
                self.paused = !self.paused;
                return if self.paused { Action::Redraw } else { Action::Rebuild };
            }
            KeyCode::Char('r') => {
                self.selected = 0;
                return Action::Reset;
            }
            KeyCode::Char('l') => {
                self.lines = !self.lines;
                self.selected = 0;
                return Action::Rebuild;
            }
            KeyCode::Char('t') => {
                let at = threads.iter().position(|t| t.selection() == self.thread).map_or(0, |i| i + 1);
                self.picking = Some(at);
            }
            KeyCode::Up => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down => self.selected = (self.selected + 1).min(last),
            KeyCode::PageUp => self.selected = self.selected.saturating_sub(page),
            KeyCode::PageDown => self.selected = (self.selected + page).min(last),
            KeyCode::Home => self.selected = 0,
            KeyCode::End => self.selected = last,
            _ => return Action::Nothing,
        }
        Action::Redraw
    }

    /// Keys of the callers-and-callees view: move among them, Enter shows
    /// the chosen one's, Esc or Backspace goes back one. None: not its key.
    fn detail_key(&mut self, k: KeyEvent, related: &[RowKey]) -> Option<Action> {
        let last = related.len().saturating_sub(1);
        match k.code {
            KeyCode::Up => self.detail_cursor = self.detail_cursor.saturating_sub(1),
            KeyCode::Down => self.detail_cursor = (self.detail_cursor + 1).min(last),
            KeyCode::Home => self.detail_cursor = 0,
            KeyCode::End => self.detail_cursor = last,
            KeyCode::Enter => {
                let next = related.get(self.detail_cursor)?.function_row();
                if let Some(cur) = self.detail.replace(next) {
                    self.detail_back.push(cur);
                }
                self.detail_cursor = 0;
                return Some(Action::Rebuild);
            }
            KeyCode::Esc | KeyCode::Backspace => {
                self.detail = self.detail_back.pop();
                self.detail_cursor = 0;
                return Some(Action::Rebuild);
            }
            _ => return None,
        }
        Some(Action::Redraw)
    }

    /// Keys while the thread picker is open: move, Enter picks, Esc or t closes.
    fn pick_key(&mut self, k: KeyEvent, at: usize, threads: &[ThreadInfo]) -> Action {
        let last = threads.len();
        let at = match k.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc | KeyCode::Char('t') | KeyCode::Backspace => {
                self.picking = None;
                return Action::Redraw;
            }
            KeyCode::Enter => {
                self.picking = None;
                self.thread = match at {
                    0 => Selection::All,
                    i => threads.get(i - 1).map_or(Selection::All, ThreadInfo::selection),
                };
                self.selected = 0;
                self.detail = None;
                self.detail_back.clear();
                return Action::Rebuild;
            }
            KeyCode::Up => at.saturating_sub(1),
            KeyCode::Down => (at + 1).min(last),
            KeyCode::PageUp | KeyCode::Home => 0,
            KeyCode::PageDown | KeyCode::End => last,
            _ => return Action::Nothing,
        };
        self.picking = Some(at.min(last));
        Action::Redraw
    }

    fn filter_key(&mut self, k: KeyEvent) -> Action {
        match k.code {
            KeyCode::Esc => {
                self.filter.clear();
                self.typing = false;
            }
            KeyCode::Enter => self.typing = false,
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Char(c) => self.filter.push(c),
            _ => return Action::Nothing,
        }
        self.selected = 0;
        Action::Redraw
    }

    /// Keep the selection on a row after the rows changed.
    pub fn clamp(&mut self, rows: usize) {
        self.selected = self.selected.min(rows.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(ui: &mut Ui, code: KeyCode, threads: &[ThreadInfo]) -> Action {
        ui.key(KeyEvent::new(code, KeyModifiers::NONE), threads, 10, 5, None, &[])
    }

    #[test]
    fn thread_picker_picks_and_cancels() {
        let threads: Vec<ThreadInfo> = (1..=2).map(|i| ThreadInfo { pid: 9, native_id: Some(i), ..Default::default() }).collect();
        let mut ui = Ui::default();
        assert_eq!(press(&mut ui, KeyCode::Char('t'), &threads), Action::Redraw);
        assert_eq!(ui.picking, Some(0));
        for _ in 0..5 {
            press(&mut ui, KeyCode::Down, &threads);
        }
        assert_eq!(ui.picking, Some(2));
        press(&mut ui, KeyCode::Up, &threads);
        assert_eq!(press(&mut ui, KeyCode::Enter, &threads), Action::Rebuild);
        assert_eq!((ui.thread, ui.picking), (Selection::Thread(9, 1), None));
        // Opens at the thread shown; Esc leaves it as it was.
        press(&mut ui, KeyCode::Char('t'), &threads);
        assert_eq!(ui.picking, Some(1));
        press(&mut ui, KeyCode::Home, &threads);
        assert_eq!(press(&mut ui, KeyCode::Esc, &threads), Action::Redraw);
        assert_eq!((ui.thread, ui.picking), (Selection::Thread(9, 1), None));
        press(&mut ui, KeyCode::Char('t'), &threads);
        press(&mut ui, KeyCode::Home, &threads);
        press(&mut ui, KeyCode::Enter, &threads);
        assert_eq!(ui.thread, Selection::All);
    }

    #[test]
    fn filter_typing_and_escape() {
        let mut ui = Ui::default();
        press(&mut ui, KeyCode::Char('/'), &[]);
        for c in "thi".chars() {
            press(&mut ui, KeyCode::Char(c), &[]);
        }
        // While typing, 'q' is part of the filter, not quit.
        assert_eq!(press(&mut ui, KeyCode::Char('q'), &[]), Action::Redraw);
        assert_eq!(ui.filter, "thiq");
        press(&mut ui, KeyCode::Backspace, &[]);
        press(&mut ui, KeyCode::Enter, &[]);
        assert_eq!((ui.filter.as_str(), ui.typing), ("thi", false));
        press(&mut ui, KeyCode::Esc, &[]);
        assert!(ui.filter.is_empty());
        assert_eq!(press(&mut ui, KeyCode::Char('q'), &[]), Action::Quit);
    }

    #[test]
    fn callers_and_callees_lead_on_and_back() {
        let key = |f: &str| RowKey { function: f.into(), file: "app.py".into(), line: Some(3) };
        let mut ui = Ui::default();
        let k = |c| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(ui.key(k(KeyCode::Enter), &[], 3, 5, Some(&key("leaf")), &[]), Action::Rebuild);
        assert_eq!(ui.detail.as_ref().map(|d| (&*d.function, d.line)), Some(("leaf", None)));
        let related = [key("mid"), key("top")];
        for _ in 0..3 {
            ui.key(k(KeyCode::Down), &[], 3, 5, None, &related);
        }
        assert_eq!(ui.detail_cursor, 1);
        ui.key(k(KeyCode::Enter), &[], 3, 5, None, &related);
        assert_eq!(ui.detail.as_ref().map(|d| &*d.function), Some("top"));
        assert_eq!((ui.detail_cursor, ui.detail_back.len()), (0, 1));
        ui.key(k(KeyCode::Backspace), &[], 3, 5, None, &[]);
        assert_eq!(ui.detail.as_ref().map(|d| &*d.function), Some("leaf"));
        ui.key(k(KeyCode::Esc), &[], 3, 5, None, &[]);
        assert!(ui.detail.is_none());
        // Enter with nothing to go to does nothing.
        ui.detail = Some(key("x"));
        assert_eq!(ui.key(k(KeyCode::Enter), &[], 3, 5, None, &[]), Action::Nothing);
    }

    #[test]
    fn moving_stays_in_the_rows() {
        let mut ui = Ui::default();
        press(&mut ui, KeyCode::End, &[]);
        assert_eq!(ui.selected, 9);
        press(&mut ui, KeyCode::PageDown, &[]);
        assert_eq!(ui.selected, 9);
        press(&mut ui, KeyCode::PageUp, &[]);
        assert_eq!(ui.selected, 4);
        press(&mut ui, KeyCode::Home, &[]);
        press(&mut ui, KeyCode::Up, &[]);
        assert_eq!(ui.selected, 0);
    }
}
