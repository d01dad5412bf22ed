//! Drawing one [`Screen`] with ratatui: the header, the rows (or one
//! function's callers and callees) and the key line. Columns that do not
//! fit are left out (trend, then times) rather than squeezed; a terminal
//! smaller than [`MIN_WIDTH`]×[`MIN_HEIGHT`] gets one line saying so.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};

use super::keys::Ui;
use super::model::{Related, TREND_LEN};
use super::screen::{About, Screen, SortBy};

pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 8;
pub const TOO_SMALL: &str = "terminal too small";

const HEADER_LINES: u16 = 3;

/// Rows that fit in the table at this terminal size (for PgUp/PgDn).
pub fn page(area: Rect) -> usize {
    // Header, the table's column line, the key line.
    area.height.saturating_sub(HEADER_LINES + 2) as usize
}

/// `ended`: why sampling stopped, once it has.
pub fn draw(f: &mut Frame, about: &About, screen: &Screen, ui: &Ui, ended: Option<&str>) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!("{TOO_SMALL} ({}x{}, need {MIN_WIDTH}x{MIN_HEIGHT})", area.width, area.height);
        f.render_widget(Paragraph::new(msg), Rect { height: area.height.min(1), ..area });
        return;
    }
    let [head, body, keys] = Layout::vertical([Constraint::Length(HEADER_LINES), Constraint::Min(1), Constraint::Length(1)]).areas(area);
    header(f, head, about, screen, ui, ended);
    match &screen.detail {
        _ if ui.picking.is_some() => picker(f, body, screen, ui),
        Some(_) if ui.detail.is_some() => detail(f, body, about, screen, ui.detail_cursor),
        _ => table(f, body, about, screen, ui),
    }
    let help = if ui.typing {
        format!("filter: {}▏  (Enter keeps it, Esc clears)", ui.filter)
    } else if ui.picking.is_some() && ended.is_none() {
        "↑↓ choose · Enter show this thread · Esc back".to_string()
    } else if ended.is_some() {
        "press any key to quit".to_string()
    } else if ui.detail.is_some() {
        "↑↓ choose · Enter its callers/callees · Esc/Backspace back · q quit".to_string()
    } else {
        "q quit · 1-6/s sort · l lines · t thread · / filter · p pause · r reset · Enter callers/callees · ↑↓ PgUp PgDn Home End".to_string()
    };
    f.render_widget(Paragraph::new(help).style(Style::new().add_modifier(Modifier::REVERSED)), keys);
}

fn header(f: &mut Frame, area: Rect, about: &About, s: &Screen, ui: &Ui, ended: Option<&str>) {
    let mut third = vec![Span::raw(format!("thread: {} · {} · sort: {} ▼", s.thread_label, if s.lines { "by line" } else { "by function" }, ui.sort.name(),))];
    if !ui.filter.is_empty() {
        third.push(Span::raw(format!(" · filter: {}", ui.filter)));
    }
    if ui.paused {
        third.push(Span::styled(" · PAUSED", Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)));
    }
    let mut first = vec![Span::styled("pyprof top ", Style::new().add_modifier(Modifier::BOLD)), Span::raw(s.target_text(about))];
    if let Some(why) = ended {
        first.insert(1, Span::styled(format!("{why} "), Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD)));
    }
    let lines = vec![
        Line::from(first),
        Line::from(format!("{} · errors: {} · %: of ticks, 100 = one thread all the time", s.shares_text(), s.errors_text())),
        Line::from(third),
    ];
    f.render_widget(Paragraph::new(lines), area);
}

fn table(f: &mut Frame, area: Rect, about: &About, s: &Screen, ui: &Ui) {
    // Which columns fit: the function name keeps at least 20 cells.
    let times = area.width >= 70;
    let trend = area.width >= 100;
    let mut cols: Vec<(SortBy, &str, u16)> = vec![(SortBy::Own, "OWN%", 6), (SortBy::Total, "TOTAL%", 6)];
    if times {
        cols.push((SortBy::OwnTime, "OWN s", 8));
        cols.push((SortBy::TotalTime, "TOTAL s", 8));
    }
    if trend {
        cols.push((SortBy::Trend, "TREND", TREND_LEN as u16));
    }
    cols.push((SortBy::Name, "FUNCTION", 0));
    let head = Row::new(cols.iter().map(|&(by, name, _)| {
        let mark = if by == ui.sort { "▼" } else { "" };
        Cell::from(format!("{name}{mark}"))
    }))
    .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let visible = s.visible(ui.sort, &ui.filter);
    let rows = visible.iter().map(|r| {
        let mut cells = vec![Cell::from(format!("{:6.1}", s.pct(r.own))), Cell::from(format!("{:6.1}", s.pct(r.total)))];
        if times {
            cells.push(Cell::from(format!("{:8.2}", s.secs(r.own))));
            cells.push(Cell::from(format!("{:8.2}", s.secs(r.total))));
        }
        if trend {
            cells.push(Cell::from(s.sparkline(r)).style(Style::new().fg(Color::Cyan)));
        }
        cells.push(Cell::from(s.label(about, &r.key)));
        Row::new(cells)
    });
    let widths = cols.iter().map(|&(_, _, w)| if w == 0 { Constraint::Min(10) } else { Constraint::Length(w) });
    let table = Table::new(rows, widths).header(head).row_highlight_style(Style::new().add_modifier(Modifier::REVERSED)).highlight_symbol(">");
    let mut state = TableState::default();
    if !visible.is_empty() {
        state.select(Some(ui.selected.min(visible.len() - 1)));
    }
    f.render_stateful_widget(table, area, &mut state);
}

/// All threads, then each with its share of ticks (sampled with a Python stack).
fn picker(f: &mut Frame, area: Rect, s: &Screen, ui: &Ui) {
    let head =
        Row::new([Cell::from("SAMPLED%"), Cell::from("THREAD (pick with Enter)")]).style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let mut rows = vec![Row::new([Cell::from(""), Cell::from(format!("all threads ({})", s.thread_list.len()))])];
    let several = s.thread_list.iter().any(|t| t.pid != s.thread_list[0].pid);
    rows.extend(s.thread_list.iter().map(|t| {
        let label = if several { format!("{} in {}", t.label(), t.pid) } else { t.label() };
        Row::new([Cell::from(format!("{:8.1}", s.pct(t.counts.samples))), Cell::from(label)])
    }));
    let table = Table::new(rows, [Constraint::Length(8), Constraint::Min(10)])
        .header(head)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">");
    let mut state = TableState::default();
    state.select(ui.picking.map(|i| i.min(s.thread_list.len())));
    f.render_stateful_widget(table, area, &mut state);
}

fn detail(f: &mut Frame, area: Rect, about: &About, s: &Screen, cursor: usize) {
    let Some(d) = &s.detail else { return };
    let [title, callers, callees] = Layout::vertical([Constraint::Length(1), Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(s.label(about, &d.key), Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(" · own {:.1}% · total {:.1}%", s.pct(d.own), s.pct(d.total))),
        ])),
        title,
    );
    let n = d.callers.len();
    related(f, callers, about, s, "CALLERS (calls of it on the stack, % of ticks)", &d.callers, (cursor < n).then_some(cursor));
    related(f, callees, about, s, "CALLEES (what it called, % of ticks)", &d.callees, cursor.checked_sub(n));
}

fn related(f: &mut Frame, area: Rect, about: &About, s: &Screen, title: &str, list: &[Related], chosen: Option<usize>) {
    let head = Row::new([Cell::from("SHARE%"), Cell::from(title.to_string())]).style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let rows: Vec<Row> = if list.is_empty() {
        vec![Row::new([Cell::from(""), Cell::from("(none)")])]
    } else {
        list.iter().map(|r| Row::new([Cell::from(format!("{:6.1}", s.pct(r.samples))), Cell::from(s.label(about, &r.key))])).collect()
    };
    let table = Table::new(rows, [Constraint::Length(6), Constraint::Min(10)])
        .header(head)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">");
    let mut state = TableState::default();
    state.select(chosen.filter(|&i| i < list.len()));
    f.render_stateful_widget(table, area, &mut state);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::*;
    use crate::sampler::SamplerStats;
    use crate::stack::Frame;
    use crate::top::model::{Batch, BatchThread};
    use crate::top::model::{Model, RowKey, Selection};

    fn screen(detail: bool) -> (Screen, Ui) {
        let mut m = Model::new();
        let mut t = BatchThread { pid: 1, native_id: Some(1), name: Some("main".into()), ..Default::default() };
        let long = "a_function_name_long_enough_to_be_cut_anywhere_".repeat(4);
        t.stacks.insert(vec![Frame::python(&long, "/very/long/path/to/some/module.py", 12), Frame::python("main", "app.py", 3)], 70);
        t.stacks.insert(vec![Frame::python("main", "app.py", 4)], 30);
        m.ingest(&Batch { threads: vec![t], ticks: 100, elapsed: Duration::from_secs(1), ..Default::default() });
        let key = RowKey::of(&Frame::python("main", "app.py", 3), false);
        let ui = Ui { detail: detail.then(|| key.clone()), paused: true, filter: "m".into(), ..Default::default() };
        let s = Screen::build(&m, Selection::All, false, &SamplerStats::default(), Some(99.0), Duration::from_secs(1), ui.detail.as_ref());
        (s, ui)
    }

    /// Every size from 1x1 up draws without a panic (no u16 underflow, no
    /// layout that cannot be met), and small ones say they are too small.
    #[test]
    fn every_terminal_size_draws() {
        let about = About { pid: 1, command: "python app.py".into(), python_version: "3.12.1".into(), sampler: "ptrace", ..Default::default() };
        for (detail, picking) in [(false, false), (true, false), (false, true)] {
            let (s, mut ui) = screen(detail);
            ui.picking = picking.then_some(1);
            for w in 1..=130u16 {
                for h in 1..=45u16 {
                    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
                    term.draw(|f| draw(f, &about, &s, &ui, Some("target exited"))).unwrap();
                    let first: String = term.backend().buffer().content().iter().take(w as usize).map(|c| c.symbol()).collect();
                    if w < MIN_WIDTH || h < MIN_HEIGHT {
                        assert!(TOO_SMALL.starts_with(first.trim_end()) || first.starts_with(TOO_SMALL), "{w}x{h}: {first:?}");
                    } else {
                        assert!(first.starts_with("pyprof top"), "{w}x{h}: {first:?}");
                    }
                }
            }
        }
    }
}
