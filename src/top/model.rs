//! What `top` has seen since its last reset: one row per function and one
//! per line, per thread, with own and total counts, who calls whom, and a
//! short history per row for the trend column. No terminal code here, so
//! it is unit-tested; the view asks it for rows and draws them.
//!
//! Memory is bounded whatever the target does: at most [`MAX_ROWS`]
//! distinct functions and lines (then "[other functions]"), [`MAX_CELLS`]
//! (thread, row) counters with [`TREND_LEN`] history slots each,
//! [`MAX_EDGES`] (thread, caller, callee) counters (then new pairs are not
//! counted, and [`Model::lost_edges`] says how many) and [`MAX_THREADS`]
//! threads (then "[other threads]"). With hash tables at their largest
//! that is about 25 MiB (counters 15, call pairs 4, rows 5) besides the
//! strings of the row names, which the sampler's caches share.

use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use crate::sampler::SamplerStats;
use crate::stack::Frame;

/// Refreshes of history per row (the trend column).
pub const TREND_LEN: usize = 20;
pub const MAX_ROWS: usize = 1 << 15;
pub const MAX_CELLS: usize = 1 << 16;
pub const MAX_EDGES: usize = 1 << 16;
pub const MAX_THREADS: usize = 1 << 10;

pub const OTHER_ROWS: &str = "[other functions]";
pub const OTHER_THREADS: &str = "[other threads]";

/// A function (`line` None) or one line of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowKey {
    pub function: Arc<str>,
    pub file: Arc<str>,
    pub line: Option<u32>,
}

impl RowKey {
    pub fn of(f: &Frame, line: bool) -> RowKey {
        RowKey { function: f.function.clone(), file: f.file.clone(), line: if line && f.line > 0 { Some(f.line as u32) } else { None } }
    }

    /// The function this row belongs to (itself for a function row).
    pub fn function_row(&self) -> RowKey {
        RowKey { line: None, ..self.clone() }
    }

    pub fn is_line(&self) -> bool {
        self.line.is_some()
    }
}

/// Which threads a view counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Selection {
    #[default]
    All,
    /// (pid, native id or 0).
    Thread(i32, u64),
}

#[derive(Debug, Clone, Default)]
pub struct ThreadInfo {
    pub pid: i32,
    pub native_id: Option<u64>,
    pub name: Option<String>,
    pub counts: Counts,
}

impl ThreadInfo {
    pub fn selection(&self) -> Selection {
        Selection::Thread(self.pid, self.native_id.unwrap_or(0))
    }

    pub fn label(&self) -> String {
        match (&self.name, self.native_id) {
            (Some(n), Some(id)) => format!("{n} ({id})"),
            (Some(n), None) => n.clone(),
            (None, Some(id)) => format!("{id}"),
            (None, None) => "?".into(),
        }
    }
}

/// The samples of one thread since the last batch.
#[derive(Debug, Default)]
pub struct BatchThread {
    pub pid: i32,
    pub native_id: Option<u64>,
    pub name: Option<String>,
    /// Stack (innermost first) → samples.
    pub stacks: HashMap<Vec<Frame>, u64>,
    pub counts: Counts,
}

/// What the sampler saw since the last batch.
#[derive(Debug, Default)]
pub struct Batch {
    pub threads: Vec<BatchThread>,
    pub ticks: u64,
    pub elapsed: Duration,
    /// The sampler's counts since it started (rate, errors).
    pub stats: SamplerStats,
    /// Threads in the last snapshot.
    pub threads_seen: usize,
}

/// Samples of a thread (or all), and how many of them held the GIL, were
/// on a CPU, or ran the garbage collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub samples: u64,
    pub gil: u64,
    pub cpu: u64,
    pub gc: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.samples += o.samples;
        self.gil += o.gil;
        self.cpu += o.cpu;
        self.gc += o.gc;
    }
}

#[derive(Debug, Clone, Default)]
struct Cell {
    own: u64,
    total: u64,
    /// Total samples per refresh, by epoch % TREND_LEN; slots after
    /// `epoch` are stale and read as 0 (cleared lazily, so a quiet row costs nothing).
    ring: [u32; TREND_LEN],
    epoch: u64,
}

impl Cell {
    fn count(&mut self, epoch: u64, n: u64) {
        if epoch != self.epoch {
            let gap = (epoch - self.epoch).min(TREND_LEN as u64);
            for k in 1..=gap {
                self.ring[((self.epoch + k) % TREND_LEN as u64) as usize] = 0;
            }
            self.epoch = epoch;
        }
        let slot = &mut self.ring[(epoch % TREND_LEN as u64) as usize];
        *slot = slot.saturating_add(n.min(u32::MAX as u64) as u32);
    }

    /// Oldest first; the last slot is the running refresh.
    fn trend(&self, epoch: u64, out: &mut [u64; TREND_LEN]) {
        for (i, o) in out.iter_mut().enumerate() {
            let back = (TREND_LEN - 1 - i) as u64;
            let Some(e) = epoch.checked_sub(back) else { continue };
            if e <= self.epoch && e + (TREND_LEN as u64) > self.epoch {
                *o += self.ring[(e % TREND_LEN as u64) as usize] as u64;
            }
        }
    }
}

/// One row of a view: counts summed over the selected threads.
#[derive(Debug, Clone)]
pub struct Row {
    pub key: RowKey,
    pub own: u64,
    pub total: u64,
    /// Total samples per refresh, oldest first.
    pub trend: [u64; TREND_LEN],
}

/// A caller or callee of a function, with the samples in which that call was on the stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Related {
    pub key: RowKey,
    pub samples: u64,
}

/// Where rows go when there is no room for more: one for functions, one (line 0) for lines.
fn other_row(line: bool) -> RowKey {
    RowKey { function: Arc::from(OTHER_ROWS), file: Arc::from(""), line: line.then_some(0) }
}

#[derive(Default)]
pub struct Model {
    rows: Vec<RowKey>,
    row_ids: HashMap<RowKey, u32>,
    /// Per row: the last stack that counted it, so recursion counts once in total.
    row_stamp: Vec<u64>,
    /// Per row: a function row that frames without a line (native code,
    /// markers) also use as their line row; it shows in both views.
    row_lineless: Vec<bool>,
    threads: Vec<ThreadInfo>,
    thread_ids: HashMap<(i32, u64), u32>,
    cells: HashMap<(u32, u32), Cell>,
    /// (thread, caller function row, callee function row) → (samples, last stamp).
    edges: HashMap<(u32, u32, u32), (u64, u64)>,
    stamp: u64,
    epoch: u64,
    /// Ticks and time since the reset: shares are of ticks (100 % = one
    /// thread, all of the time), times are samples × elapsed / ticks.
    pub ticks: u64,
    pub elapsed: Duration,
    /// Samples whose rows were counted under [`OTHER_ROWS`] for lack of room.
    pub overflowed: u64,
    pub lost_edges: u64,
    scratch: Vec<u32>,
}

impl Model {
    pub fn new() -> Model {
        Model::default()
    }

    /// Forget every count (`r`); the trend's clock keeps running.
    pub fn reset(&mut self) {
        let epoch = self.epoch;
        *self = Model { epoch, ..Model::default() };
    }

    /// A refresh ended: the trend moves one slot on.
    pub fn end_interval(&mut self) {
        self.epoch += 1;
    }

    pub fn threads(&self) -> &[ThreadInfo] {
        &self.threads
    }

    /// The processes seen since the reset.
    pub fn pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.threads.iter().map(|t| t.pid).filter(|&p| p > 0).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn distinct_rows(&self) -> usize {
        self.rows.len()
    }

    pub fn cells(&self) -> usize {
        self.cells.len()
    }

    pub fn edges(&self) -> usize {
        self.edges.len()
    }

    pub fn ingest(&mut self, b: &Batch) {
        self.ticks += b.ticks;
        self.elapsed += b.elapsed;
        for t in &b.threads {
            let ti = self.thread(t.pid, t.native_id, t.name.as_deref());
            self.threads[ti as usize].counts.add(&t.counts);
            for (frames, &n) in &t.stacks {
                self.add_stack(ti, frames, n);
            }
        }
    }

    fn thread(&mut self, pid: i32, native_id: Option<u64>, name: Option<&str>) -> u32 {
        let key = (pid, native_id.unwrap_or(0));
        if let Some(&id) = self.thread_ids.get(&key) {
            let t = &mut self.threads[id as usize];
            // Threads rename themselves (threading.Thread(name=...) after start).
            if name.is_some() && t.name.as_deref() != name && t.name.as_deref() != Some(OTHER_THREADS) {
                t.name = name.map(str::to_string);
            }
            return id;
        }
        let (key, info) = if self.threads.len() + 1 >= MAX_THREADS {
            ((0, u64::MAX), ThreadInfo { pid: 0, native_id: Some(u64::MAX), name: Some(OTHER_THREADS.into()), counts: Counts::default() })
        } else {
            (key, ThreadInfo { pid, native_id, name: name.map(str::to_string), counts: Counts::default() })
        };
        if let Some(&id) = self.thread_ids.get(&key) {
            return id;
        }
        let id = self.threads.len() as u32;
        self.threads.push(info);
        self.thread_ids.insert(key, id);
        id
    }

    fn row(&mut self, key: RowKey) -> u32 {
        if let Some(&id) = self.row_ids.get(&key) {
            return id;
        }
        // Room is kept for the two "other" rows (a function one and a line one).
        let key = if self.rows.len() + 2 >= MAX_ROWS {
            self.overflowed += 1;
            other_row(key.is_line())
        } else {
            key
        };
        if let Some(&id) = self.row_ids.get(&key) {
            return id;
        }
        let id = self.rows.len() as u32;
        self.rows.push(key.clone());
        self.row_ids.insert(key, id);
        self.row_stamp.push(0);
        self.row_lineless.push(false);
        id
    }

    /// The row a (thread, row) counter is kept under: itself, or the
    /// "other" row of its kind once there is no room for new counters.
    fn cell_row(&mut self, thread: u32, row: u32) -> u32 {
        if self.cells.len() >= MAX_CELLS && !self.cells.contains_key(&(thread, row)) {
            let line = self.rows[row as usize].is_line();
            self.row(other_row(line))
        } else {
            row
        }
    }

    /// `n` samples of `frames` (innermost first) on thread `thread`.
    fn add_stack(&mut self, thread: u32, frames: &[Frame], n: u64) {
        self.stamp += 1;
        let stamp = self.stamp;
        let epoch = self.epoch;
        let mut fns = std::mem::take(&mut self.scratch);
        fns.clear();
        for (depth, f) in frames.iter().enumerate() {
            let fr = self.row(RowKey::of(f, false));
            let lr = self.row(RowKey::of(f, true));
            if fr == lr {
                self.row_lineless[fr as usize] = true;
            }
            fns.push(fr);
            for r in [fr, lr] {
                // Counted once per stack: a function and its line row are the
                // same row for frames without lines, and rows without room share one.
                let r = self.cell_row(thread, r);
                let first = self.row_stamp[r as usize] != stamp;
                self.row_stamp[r as usize] = stamp;
                let c = self.cells.entry((thread, r)).or_default();
                if depth == 0 && first {
                    c.own += n;
                }
                if first {
                    c.total += n;
                    c.count(epoch, n);
                }
            }
        }
        // fns is innermost first: fns[i + 1] called fns[i].
        for w in fns.windows(2) {
            let key = (thread, w[1], w[0]);
            let full = self.edges.len() >= MAX_EDGES;
            match self.edges.get_mut(&key) {
                Some(e) if e.1 == stamp => {}
                Some(e) => *e = (e.0 + n, stamp),
                None if full => self.lost_edges += n,
                None => {
                    self.edges.insert(key, (n, stamp));
                }
            }
        }
        self.scratch = fns;
    }

    fn selected(&self, sel: Selection, thread: u32) -> bool {
        match sel {
            Selection::All => true,
            Selection::Thread(pid, tid) => {
                let t = &self.threads[thread as usize];
                t.pid == pid && t.native_id.unwrap_or(0) == tid
            }
        }
    }

    /// Samples of the selected threads and how many held the GIL, ran, collected.
    pub fn counts(&self, sel: Selection) -> Counts {
        let mut c = Counts::default();
        for (i, t) in self.threads.iter().enumerate() {
            if self.selected(sel, i as u32) {
                c.add(&t.counts);
            }
        }
        c
    }

    /// Function rows (or line rows), counts summed over the selected threads, unordered.
    pub fn rows(&self, sel: Selection, lines: bool) -> Vec<Row> {
        let mut out: HashMap<u32, Row> = HashMap::default();
        for (&(thread, row), cell) in &self.cells {
            let key = &self.rows[row as usize];
            // Frames without a line (native, markers) are rows in both views.
            let shown = key.is_line() == lines || (lines && self.row_lineless[row as usize]);
            if !shown || !self.selected(sel, thread) {
                continue;
            }
            let r = out.entry(row).or_insert_with(|| Row { key: key.clone(), own: 0, total: 0, trend: [0; TREND_LEN] });
            r.own += cell.own;
            r.total += cell.total;
            cell.trend(self.epoch, &mut r.trend);
        }
        out.into_values().collect()
    }

    fn related(&self, sel: Selection, function: &RowKey, callers: bool) -> Vec<Related> {
        let Some(&id) = self.row_ids.get(&function.function_row()) else { return Vec::new() };
        let mut out: HashMap<u32, u64> = HashMap::default();
        for (&(thread, caller, callee), &(n, _)) in &self.edges {
            if !self.selected(sel, thread) {
                continue;
            }
            let other = match callers {
                true if callee == id => caller,
                false if caller == id => callee,
                _ => continue,
            };
            *out.entry(other).or_insert(0) += n;
        }
        let mut v: Vec<Related> = out.into_iter().map(|(r, samples)| Related { key: self.rows[r as usize].clone(), samples }).collect();
        v.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.key.function.cmp(&b.key.function)));
        v
    }

    /// Who called `function` (any row of it), heaviest first.
    pub fn callers(&self, sel: Selection, function: &RowKey) -> Vec<Related> {
        self.related(sel, function, true)
    }

    /// Whom `function` called, heaviest first.
    pub fn callees(&self, sel: Selection, function: &RowKey) -> Vec<Related> {
        self.related(sel, function, false)
    }

    /// The own and total samples of `function` over the selected threads.
    pub fn function_counts(&self, sel: Selection, function: &RowKey) -> (u64, u64) {
        let Some(&id) = self.row_ids.get(&function.function_row()) else { return (0, 0) };
        let mut own = 0;
        let mut total = 0;
        for (i, _) in self.threads.iter().enumerate() {
            if let Some(c) = self.cells.get(&(i as u32, id)).filter(|_| self.selected(sel, i as u32)) {
                own += c.own;
                total += c.total;
            }
        }
        (own, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, line: i32) -> Frame {
        Frame::python(name, "app.py", line)
    }

    /// One batch of `n` samples of `stack` on thread `tid`.
    fn batch(tid: u64, name: &str, stacks: &[(&[Frame], u64)], ticks: u64) -> Batch {
        let mut t = BatchThread { pid: 1, native_id: Some(tid), name: Some(name.into()), ..Default::default() };
        for (s, n) in stacks {
            t.stacks.insert(s.to_vec(), *n);
            t.counts.samples += n;
        }
        Batch { threads: vec![t], ticks, elapsed: Duration::from_millis(ticks * 10), ..Default::default() }
    }

    fn row<'a>(rows: &'a [Row], name: &str) -> &'a Row {
        rows.iter().find(|r| &*r.key.function == name).unwrap_or_else(|| panic!("no row {name}"))
    }

    #[test]
    fn own_and_total_with_recursion_counted_once() {
        let mut m = Model::new();
        // main → fib → fib → fib: fib is on the stack three times, counted once.
        let rec = [f("fib", 3), f("fib", 4), f("fib", 4), f("main", 9)];
        let other = [f("leaf", 1), f("main", 10)];
        m.ingest(&batch(7, "main", &[(&rec, 6), (&other, 4)], 10));
        let rows = m.rows(Selection::All, false);
        assert_eq!((row(&rows, "fib").own, row(&rows, "fib").total), (6, 6));
        assert_eq!((row(&rows, "main").own, row(&rows, "main").total), (0, 10));
        assert_eq!((row(&rows, "leaf").own, row(&rows, "leaf").total), (4, 4));
        // Line rows: fib line 4 is twice on the stack, once in total; line 3 owns.
        let lines = m.rows(Selection::All, true);
        let fib4 = lines.iter().find(|r| &*r.key.function == "fib" && r.key.line == Some(4)).unwrap();
        let fib3 = lines.iter().find(|r| &*r.key.function == "fib" && r.key.line == Some(3)).unwrap();
        assert_eq!((fib4.own, fib4.total, fib3.own, fib3.total), (0, 6, 6, 6));
        assert!(lines.iter().all(|r| r.key.is_line()), "{lines:?}");
        assert_eq!(m.ticks, 10);
    }

    #[test]
    fn threads_are_counted_apart_and_together() {
        let mut m = Model::new();
        m.ingest(&batch(1, "main", &[(&[f("work", 1)], 5)], 5));
        m.ingest(&batch(2, "idler", &[(&[f("wait", 2)], 5)], 0));
        let main = Selection::Thread(1, 1);
        let idler = m.threads().iter().find(|t| t.name.as_deref() == Some("idler")).unwrap().selection();
        assert_eq!(m.rows(main, false).len(), 1);
        assert_eq!(&*m.rows(idler, false)[0].key.function, "wait");
        assert_eq!(m.rows(Selection::All, false).len(), 2);
        assert_eq!(m.counts(Selection::All).samples, 10);
        assert_eq!(m.counts(idler).samples, 5);
    }

    #[test]
    fn callers_and_callees_with_their_samples() {
        let mut m = Model::new();
        let a = [f("leaf", 1), f("mid", 2), f("top", 3)];
        let b = [f("leaf", 1), f("other", 5), f("top", 3)];
        let c = [f("mid", 2), f("top", 3)];
        // Recursion: mid → mid counts once per sample.
        let r = [f("mid", 2), f("mid", 2), f("mid", 7), f("top", 3)];
        m.ingest(&batch(1, "main", &[(&a, 5), (&b, 3), (&c, 2), (&r, 1)], 11));
        let callers = m.callers(Selection::All, &RowKey::of(&f("leaf", 1), false));
        assert_eq!(callers.iter().map(|r| (&*r.key.function, r.samples)).collect::<Vec<_>>(), [("mid", 5), ("other", 3)]);
        let callees = m.callees(Selection::All, &RowKey::of(&f("top", 3), true));
        assert_eq!(callees.iter().map(|r| (&*r.key.function, r.samples)).collect::<Vec<_>>(), [("mid", 8), ("other", 3)]);
        let mid = m.callees(Selection::All, &RowKey::of(&f("mid", 2), false));
        assert_eq!(mid.iter().map(|r| (&*r.key.function, r.samples)).collect::<Vec<_>>(), [("leaf", 5), ("mid", 1)]);
        assert_eq!(m.function_counts(Selection::All, &RowKey::of(&f("mid", 9), true)), (3, 8));
    }

    #[test]
    fn reset_forgets_everything() {
        let mut m = Model::new();
        m.ingest(&batch(1, "main", &[(&[f("a", 1), f("b", 2)], 5)], 5));
        m.end_interval();
        m.reset();
        assert!(m.rows(Selection::All, false).is_empty());
        assert!(m.callers(Selection::All, &RowKey::of(&f("a", 1), false)).is_empty());
        assert_eq!((m.ticks, m.threads().len(), m.distinct_rows(), m.edges()), (0, 0, 0, 0));
        m.ingest(&batch(1, "main", &[(&[f("a", 1)], 2)], 2));
        assert_eq!(row(&m.rows(Selection::All, false), "a").total, 2);
    }

    #[test]
    fn trend_keeps_the_last_refreshes_only() {
        let mut m = Model::new();
        for i in 0..(TREND_LEN as u64 + 5) {
            m.ingest(&batch(1, "main", &[(&[f("a", 1)], i + 1)], i + 1));
            m.end_interval();
        }
        // The running refresh is empty; before it, the last TREND_LEN - 1 ones.
        let t = row(&m.rows(Selection::All, false), "a").trend;
        let want: Vec<u64> = (7..=(TREND_LEN as u64 + 5)).collect();
        assert_eq!(&t[..TREND_LEN - 1], want.as_slice());
        assert_eq!(t[TREND_LEN - 1], 0);
        // A row quiet for a while reads zeros where it was quiet, not old counts.
        for _ in 0..3 {
            m.end_interval();
        }
        m.ingest(&batch(1, "main", &[(&[f("a", 1)], 100)], 100));
        let t = row(&m.rows(Selection::All, false), "a").trend;
        assert_eq!(&t[TREND_LEN - 4..], &[0, 0, 0, 100]);
        assert_eq!(t[TREND_LEN - 5], TREND_LEN as u64 + 5);
    }

    #[test]
    fn thread_row_counters_are_bounded_and_count_once() {
        let mut m = Model::new();
        let funcs = 20_000;
        let mut threads = Vec::new();
        for tid in 1..=4u64 {
            let mut b = BatchThread { pid: 1, native_id: Some(tid), ..Default::default() };
            for i in 0..funcs {
                // Two frames per stack: one sample, one total for each, even in the other row.
                b.stacks.insert(vec![Frame::python(&format!("f{i}"), "gen.py", 0), Frame::python(&format!("g{i}"), "gen.py", 0)], 1);
            }
            threads.push(b);
        }
        m.ingest(&Batch { threads, ticks: funcs as u64, ..Default::default() });
        assert!(m.cells() <= MAX_CELLS + 4, "{} counters", m.cells());
        for tid in 1..=4u64 {
            let rows = m.rows(Selection::Thread(1, tid), false);
            let own: u64 = rows.iter().map(|r| r.own).sum();
            assert_eq!(own, funcs as u64, "thread {tid}");
            // Each row's total never exceeds the samples: the other row counts a stack once.
            assert!(rows.iter().all(|r| r.total <= funcs as u64), "thread {tid}");
        }
    }

    #[test]
    fn distinct_rows_are_bounded() {
        let mut m = Model::new();
        let mut b = BatchThread { pid: 1, native_id: Some(1), ..Default::default() };
        for i in 0..(MAX_ROWS as i32) {
            b.stacks.insert(vec![Frame::python(&format!("f{i}"), "gen.py", 1)], 1);
        }
        m.ingest(&Batch { threads: vec![b], ticks: MAX_ROWS as u64, ..Default::default() });
        assert!(m.distinct_rows() <= MAX_ROWS, "{} rows", m.distinct_rows());
        assert!(m.cells() <= MAX_CELLS + 1);
        assert!(m.overflowed > 0);
        let rows = m.rows(Selection::All, false);
        let other = row(&rows, OTHER_ROWS);
        let counted: u64 = rows.iter().map(|r| r.total).sum();
        // Nothing is lost: what had no room is under the other row.
        assert_eq!(counted, MAX_ROWS as u64);
        assert!(other.total > 0);
    }
}
