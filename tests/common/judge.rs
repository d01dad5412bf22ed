//! A measurement with statistical bounds, judged the way every such test
//! here is: repeated once when beyond a bound, and when unsteady, up to a
//! few times.

use super::{in_ci, skipped};

/// What one measurement found; each says its numbers.
pub enum Outcome {
    Within(String),
    Beyond(String),
    /// The reference did not hold still while it was recorded, or a stall
    /// left too few samples to compare, so the measurement says nothing
    /// about pyprof's shares (it is not judged).
    Unsteady(String),
}

/// Unsteady references measured before a case counts as not measurable.
const UNSTEADY_TRIES: usize = 5;

/// Run `measure` until it is judged. The bounds are statistical (samples
/// are a few standard errors from them at worst), so a measurement beyond
/// a bound is repeated on a fresh target, and the test fails only if the
/// repeat is beyond it too: a chance excursion, or a burst of load from
/// outside the test, is then not a failure, while a real bias (the sampler
/// this replaced was 4-18 pp off on the short callees) fails both. A stall
/// of the host under a CI run moved one 3.15 handler share 5.6 pp from the
/// target's own clock (159 ticks skipped), where quiet runs are within 1. An
/// unsteady measurement is repeated too (up to [`UNSTEADY_TRIES`] times:
/// on some days this VM's host makes the 3.12 workload's own split wander
/// 6-8 pp between 5 s recordings for minutes, or stalls a recording); after that the case is skipped
/// on a developer machine (said on stderr and counted by scripts/test.sh)
/// and fails in CI.
pub fn judged(test: &str, measure: impl Fn() -> Outcome) {
    let (mut beyond, mut unsteady) = (Vec::new(), Vec::new());
    loop {
        match measure() {
            Outcome::Within(numbers) => {
                let again = if beyond.is_empty() && unsteady.is_empty() { "" } else { "measured again, " };
                eprintln!("{test}: {again}within the bounds: {numbers}");
                return;
            }
            Outcome::Beyond(numbers) => {
                eprintln!("{test}: BEYOND A BOUND: {numbers}");
                beyond.push(numbers);
                assert!(beyond.len() < 2, "{}\nand again, on a fresh target:\n{}", beyond[0], beyond[1]);
            }
            Outcome::Unsteady(numbers) => {
                eprintln!("{test}: unsteady, not judged: {numbers}");
                unsteady.push(numbers);
                if unsteady.len() == UNSTEADY_TRIES {
                    // Nothing else runs next to this test in CI (it holds
                    // `heavy`, and cargo runs one test binary at a time):
                    // there an unsteady workload is a fault of the set-up.
                    let msg = format!("{test}: the measurement never held still in {UNSTEADY_TRIES} tries (is the machine busy?):\n{}", unsteady.join("\n"));
                    if in_ci() {
                        panic!("{msg}");
                    }
                    skipped(&format!("on this developer machine: {msg}"));
                    return;
                }
            }
        }
    }
}
