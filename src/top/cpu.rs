//! The target's CPU use from `/proc/PID/stat` (user + system time of all
//! its threads), once per refresh: one small read, where asking every
//! thread at every tick (`--mode cpu`) would cost a read per thread per
//! tick. The kernel counts in clock ticks (usually 10 ms), so over a
//! one-second refresh the figure is good to about ±1 % of a core.

use std::collections::HashMap;
use std::time::Instant;

pub struct CpuMeter {
    tick_hz: f64,
    /// Per process watched: when it was last read and its time then.
    last: HashMap<i32, (Instant, u64)>,
}

impl CpuMeter {
    pub fn new() -> CpuMeter {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        CpuMeter { tick_hz: if hz > 0 { hz as f64 } else { 100.0 }, last: HashMap::new() }
    }

    /// % of one core used by `pids` together since the last call; a process
    /// counts from its second call on. None when none could be measured yet
    /// (the first call, or every process gone).
    pub fn sample(&mut self, pids: &[i32]) -> Option<f64> {
        let mut total = None;
        let mut seen = HashMap::new();
        for &pid in pids {
            let now = Instant::now();
            let Some(ticks) = cpu_ticks(pid) else { continue };
            if let Some(&(t, before)) = self.last.get(&pid) {
                let wall = now.duration_since(t).as_secs_f64();
                if wall > 0.0 {
                    *total.get_or_insert(0.0) += 100.0 * ticks.saturating_sub(before) as f64 / self.tick_hz / wall;
                }
            }
            seen.insert(pid, (now, ticks));
        }
        // Gone processes are forgotten: pids are reused.
        self.last = seen;
        total
    }
}

/// utime + stime of the whole process, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_spinning_thread_of_this_process() {
        let me = [std::process::id() as i32];
        let mut m = CpuMeter::new();
        assert_eq!(m.sample(&me), None);
        let end = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < end {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let share = m.sample(&me).unwrap();
        // Other test threads may run too: at least most of a core, bounded by the machine.
        assert!(share > 50.0, "{share}");
    }
}
