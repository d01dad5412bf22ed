//! The sampler thread's side of `top`: a [`Sink`] that counts the samples
//! since the last batch and hands the batch to the view about every
//! [`BATCH_EVERY`] with a send that never blocks. When the view is slow and
//! the channel full, the batch is kept and keeps growing: a slow terminal
//! drops frames, never samples, and the sampler never waits for drawing.
//! It also feeds the whole session's [`Aggregator`] for `-o`, which the
//! view's reset does not touch.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;

use crate::profile::aggregate::Aggregator;
use crate::sampler::{Sample, SamplerStats, Sink, StopReason};
use crate::stack::Frame;

use super::model::{Batch, BatchThread};

pub const BATCH_EVERY: Duration = Duration::from_millis(250);

/// Frames of distinct stacks one batch holds at most (a view that stopped
/// reading would otherwise let it grow with every new stack): about 40 MiB;
/// then new stacks are counted as "[other stacks]".
pub const MAX_BATCH_FRAMES: usize = 1 << 20;

pub enum Msg {
    Batch(Batch),
    /// Sampling ended; the last samples come with it.
    End(Batch, StopReason),
}

pub struct Feed {
    tx: SyncSender<Msg>,
    pending: Batch,
    /// Frames held in `pending`'s stacks.
    frames: usize,
    index: HashMap<(i32, u64), usize>,
    last_sent: Instant,
    every: Duration,
    sent_ticks: u64,
    sent_elapsed: Duration,
    /// The whole session, for `-o`.
    pub full: Option<Aggregator>,
}

impl Feed {
    pub fn new(tx: SyncSender<Msg>, full: Option<Aggregator>) -> Feed {
        Feed {
            tx,
            pending: Batch::default(),
            frames: 0,
            index: HashMap::default(),
            last_sent: Instant::now(),
            every: BATCH_EVERY,
            sent_ticks: 0,
            sent_elapsed: Duration::ZERO,
            full,
        }
    }

    fn take(&mut self, stats: &SamplerStats, threads: usize) -> Batch {
        let mut b = std::mem::take(&mut self.pending);
        b.ticks = stats.ticks - self.sent_ticks;
        b.elapsed = stats.elapsed.saturating_sub(self.sent_elapsed);
        b.stats = stats.clone();
        b.threads_seen = threads;
        b
    }

    fn sent(&mut self, stats: &SamplerStats) {
        self.index.clear();
        self.frames = 0;
        self.sent_ticks = stats.ticks;
        self.sent_elapsed = stats.elapsed;
        self.last_sent = Instant::now();
    }

    /// The last batch; this one may wait, sampling is over.
    pub fn finish(mut self, stats: &SamplerStats, reason: StopReason) -> Option<Aggregator> {
        let b = self.take(stats, 0);
        let _ = self.tx.send(Msg::End(b, reason));
        self.full
    }
}

impl Sink for Feed {
    fn add(&mut self, s: &Sample) {
        if let Some(full) = self.full.as_mut() {
            full.add_stack(s.pid, s.command, s.native_id, s.name, s.frames, s.carried);
        }
        let key = (s.pid, s.native_id.unwrap_or(0));
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.pending.threads.len();
                self.pending.threads.push(BatchThread { pid: s.pid, native_id: s.native_id, name: s.name.map(str::to_string), ..Default::default() });
                self.index.insert(key, i);
                i
            }
        };
        let t = &mut self.pending.threads[i];
        t.counts.samples += 1;
        t.counts.gil += s.holds_gil as u64;
        t.counts.cpu += s.on_cpu as u64;
        t.counts.gc += s.in_gc as u64;
        if let Some(n) = t.stacks.get_mut(s.frames) {
            *n += 1;
        } else if self.frames + s.frames.len() <= MAX_BATCH_FRAMES {
            self.frames += s.frames.len();
            t.stacks.insert(s.frames.to_vec(), 1);
        } else {
            *t.stacks.entry(vec![Frame::python("[other stacks]", "", 0)]).or_insert(0) += 1;
        }
    }

    fn flush(&mut self, stats: &SamplerStats, threads: usize) {
        if self.last_sent.elapsed() < self.every {
            return;
        }
        let b = self.take(stats, threads);
        match self.tx.try_send(Msg::Batch(b)) {
            Ok(()) => self.sent(stats),
            // The view is behind: keep counting into the same batch (its
            // tick count is taken again at the next try).
            Err(TrySendError::Full(Msg::Batch(b)) | TrySendError::Disconnected(Msg::Batch(b))) => self.pending = b,
            Err(_) => {}
        }
    }

    fn wants_gil(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::sync_channel;

    use super::*;

    fn sample(frames: &[Frame], gil: bool) -> Sample<'_> {
        Sample { pid: 1, command: "python", native_id: Some(7), name: Some("main"), frames, holds_gil: gil, on_cpu: false, in_gc: false, carried: None }
    }

    fn stats(ticks: u64) -> SamplerStats {
        SamplerStats { ticks, elapsed: Duration::from_millis(ticks * 10), ..Default::default() }
    }

    /// A view that reads nothing fills the channel; the sampler neither
    /// blocks nor loses a sample: they wait in the batch it keeps.
    #[test]
    fn a_full_channel_keeps_samples_in_the_pending_batch() {
        let (tx, rx) = sync_channel(1);
        let mut feed = Feed::new(tx, Some(Aggregator::new(Default::default())));
        feed.every = Duration::ZERO;
        let a = [Frame::python("a", "x.py", 1)];
        let b = [Frame::python("b", "x.py", 2), Frame::python("a", "x.py", 1)];
        for tick in 1..=10u64 {
            feed.add(&sample(&a, true));
            feed.add(&sample(&b, false));
            // Returns at once even though nobody reads after the first batch.
            feed.flush(&stats(tick), 1);
        }
        let mut msgs: Vec<Msg> = rx.try_iter().collect();
        assert_eq!(msgs.len(), 1, "the channel holds one batch");
        // The last batch may wait for room: the view reads it.
        let full = feed.finish(&stats(10), StopReason::Duration).unwrap();
        assert_eq!(full.samples, 20);
        msgs.extend(rx.try_iter());
        let mut samples = 0;
        let mut gil = 0;
        let mut ticks = 0;
        let mut ends = 0;
        for msg in msgs {
            let b = match msg {
                Msg::Batch(b) => b,
                Msg::End(b, _) => {
                    ends += 1;
                    b
                }
            };
            ticks += b.ticks;
            for t in &b.threads {
                samples += t.stacks.values().sum::<u64>();
                gil += t.counts.gil;
            }
        }
        assert_eq!((samples, gil, ticks, ends), (20, 10, 10, 1));
    }
}
