//! The statistics of `pyprof diff` (explained for users in docs/ci.md):
//! a one-sided two-proportion z-test per function and share, with the
//! binomial variance inflated by a design effect for autocorrelated samples,
//! and Holm's step-down correction over every test made.

/// Design effect floor: applied whatever the rate.
pub const MIN_DESIGN_EFFECT: f64 = 4.0;

/// Assumed length (seconds) of a stretch of one thread's samples that may
/// behave as a single observation: at `rate` Hz the design effect is
/// `rate × 4 ms` (20 at 5 kHz). Calibrated on real A/A recordings (same
/// workload twice; docs/ci.md): the smallest design effect that kept the
/// family-wise false-alarm rate at or below 0.01 was about 2 at 1 kHz and
/// about 10 at 5 kHz, i.e. about one independent sample per 2 ms; we assume
/// twice that. Such a design effect also bounds the z of an all-or-nothing
/// stretch of L samples (e.g. start-up caught or missed, depending on when
/// the profiler attached) at `sqrt(L / design effect)`: 2.5 for 25 ms.
pub const INDEPENDENT_SPACING_SECS: f64 = 0.004;

/// The design effect assumed for a profile sampled at `rate_hz` (None: not
/// known, e.g. a collapsed file): `max(4, rate × 4 ms)`.
pub fn auto_design_effect(rate_hz: Option<f64>) -> f64 {
    match rate_hz {
        Some(r) if r.is_finite() && r > 0.0 => (r * INDEPENDENT_SPACING_SECS).max(MIN_DESIGN_EFFECT),
        _ => MIN_DESIGN_EFFECT,
    }
}

/// Complementary error function (Numerical Recipes' Chebyshev fit,
/// fractional error below 1.2e-7 everywhere, so tail probabilities stay
/// accurate far beyond any corrected alpha).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06 + t * (0.278_868_07 + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// P(Z > z) for a standard normal Z.
pub fn upper_tail(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// One comparison of a share between the two profiles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareTest {
    pub base_count: u64,
    pub new_count: u64,
    pub base_share: f64,
    pub new_share: f64,
    /// `new_share - base_share` (a fraction; × 100 for percentage points).
    pub delta: f64,
    /// The z statistic under H0 "same share" (0 when the variance is 0).
    pub z: f64,
    /// One-sided p-value for an increase, P(Z ≥ z).
    pub p_up: f64,
    /// One-sided p-value for a decrease, P(Z ≤ z).
    pub p_down: f64,
}

/// Two-proportion z-test with the pooled share under H0 and each side's
/// binomial variance multiplied by its design effect:
/// `Var = p̄(1−p̄)(d₁/n₁ + d₂/n₂)`, `p̄ = (c₁+c₂)/(n₁+n₂)`.
pub fn share_test(c1: u64, n1: u64, d1: f64, c2: u64, n2: u64, d2: f64) -> ShareTest {
    let share = |c: u64, n: u64| if n == 0 { 0.0 } else { c as f64 / n as f64 };
    let (p1, p2) = (share(c1, n1), share(c2, n2));
    let delta = p2 - p1;
    let pooled = share(c1 + c2, n1 + n2);
    let var = if n1 == 0 || n2 == 0 { 0.0 } else { pooled * (1.0 - pooled) * (d1 / n1 as f64 + d2 / n2 as f64) };
    let z = if var > 0.0 { delta / var.sqrt() } else { 0.0 };
    let (p_up, p_down) = if var > 0.0 { (upper_tail(z), upper_tail(-z)) } else { (1.0, 1.0) };
    ShareTest { base_count: c1, new_count: c2, base_share: p1, new_share: p2, delta, z, p_up, p_down }
}

/// Holm–Bonferroni adjusted p-values, in the input order: reject the i-th
/// hypothesis at family-wise level α exactly when `adjusted[i] <= α`.
/// Controls the family-wise error rate under any dependence between the
/// tests, and rejects everything Bonferroni does (and sometimes more).
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]).then(a.cmp(&b)));
    let mut adjusted = vec![1.0; m];
    let mut running: f64 = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        let scaled = ((m - rank) as f64 * p[i]).min(1.0);
        running = running.max(scaled);
        adjusted[i] = running;
    }
    adjusted
}

/// How much the two profiles spread beyond binomial noise, estimated from the
/// data: the median of z² over the given z statistics (computed with design
/// effect 1), divided by the median of a chi-squared variable with one degree
/// of freedom (0.4549). Robust to a few real changes; meaningful as a
/// calibration figure when the code did not change (an A/A comparison). None
/// with fewer than 3 values.
pub fn observed_dispersion(binomial_z: &[f64]) -> Option<f64> {
    if binomial_z.len() < 3 {
        return None;
    }
    let mut sq: Vec<f64> = binomial_z.iter().map(|z| z * z).collect();
    sq.sort_by(f64::total_cmp);
    let n = sq.len();
    let median = if n % 2 == 1 { sq[n / 2] } else { 0.5 * (sq[n / 2 - 1] + sq[n / 2]) };
    Some(median / 0.454_936_423_119_572_8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_tail_matches_tables() {
        let cases = [
            (0.0, 0.5),
            (1.0, 0.158_655_253_9),
            (1.959_963_985, 0.025),
            (2.326_347_874, 0.01),
            (3.090_232_306, 0.001),
            (5.0, 2.866_515_719e-7),
            (8.0, 6.220_960_574e-16),
        ];
        for (z, p) in cases {
            let got = upper_tail(z);
            assert!(((got - p) / p).abs() < 2e-7, "Q({z}) = {got}, want {p}");
            assert!((upper_tail(-z) - (1.0 - p)).abs() < 1e-7);
        }
    }

    #[test]
    fn z_test_against_hand_computation() {
        // 300/1000 vs 360/1000, design effect 1: pooled 0.33,
        // se = sqrt(0.33 × 0.67 × 0.002) = 0.021029, z = 0.06 / se = 2.8532.
        let t = share_test(300, 1000, 1.0, 360, 1000, 1.0);
        assert!((t.delta - 0.06).abs() < 1e-12);
        assert!((t.z - 2.853_2).abs() < 1e-3, "{}", t.z);
        assert!((t.p_up - 0.002_164).abs() < 2e-5, "{}", t.p_up);
        assert!((t.p_up + t.p_down - 1.0).abs() < 1e-9);
        // A design effect of 4 halves z.
        let t4 = share_test(300, 1000, 4.0, 360, 1000, 4.0);
        assert!((t4.z - t.z / 2.0).abs() < 1e-9);
        // Degenerate: nothing on either side, or everything on both.
        assert_eq!(share_test(0, 10, 2.0, 0, 10, 2.0).p_up, 1.0);
        assert_eq!(share_test(10, 10, 2.0, 10, 10, 2.0).p_up, 1.0);
        assert_eq!(share_test(0, 0, 2.0, 5, 10, 2.0).p_up, 1.0);
    }

    #[test]
    fn holm_adjustment() {
        let adj = holm(&[0.01, 0.04, 0.03, 0.005]);
        // Sorted: 0.005×4 = 0.02, 0.01×3 = 0.03, 0.03×2 = 0.06, 0.04×1 → max 0.06.
        let want = [0.03, 0.06, 0.06, 0.02];
        for (a, w) in adj.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adj:?}");
        }
        assert_eq!(holm(&[0.3, 0.2]), vec![0.4, 0.4]);
        assert_eq!(holm(&[0.9, 0.8]), vec![1.0, 1.0]);
        assert!(holm(&[]).is_empty());
    }

    #[test]
    fn design_effects() {
        assert_eq!(auto_design_effect(None), 4.0);
        assert_eq!(auto_design_effect(Some(100.0)), 4.0);
        assert_eq!(auto_design_effect(Some(1000.0)), 4.0);
        assert_eq!(auto_design_effect(Some(5000.0)), 20.0);
    }

    #[test]
    fn dispersion_of_standard_normal_draws_is_near_one() {
        // Deterministic "normal" draws: the quantiles of N(0,1).
        let z: Vec<f64> = (1..200).map(|i| inv_normal(i as f64 / 200.0)).collect();
        let d = observed_dispersion(&z).unwrap();
        assert!((d - 1.0).abs() < 0.05, "{d}");
        assert_eq!(observed_dispersion(&[1.0, 2.0]), None);
    }

    /// Bisection on `upper_tail`, for the test only.
    fn inv_normal(p: f64) -> f64 {
        let (mut lo, mut hi) = (-10.0, 10.0);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if 1.0 - upper_tail(mid) < p { lo = mid } else { hi = mid }
        }
        0.5 * (lo + hi)
    }
}
