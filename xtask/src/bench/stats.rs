//! The statistics every benchmark prints: quantiles of samples (milliseconds as `f64`, or
//! durations) and the unit conversions.

use std::time::Duration;

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `q` quantile (0..=1) of `v`: nearest rank on the sorted samples, except that the
/// median of an even count averages the middle two. NaN when there are no samples.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if (q - 0.5).abs() < f64::EPSILON && s.len().is_multiple_of(2) {
        return (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0;
    }
    s[index(s.len(), q)]
}

/// The median of `v`.
pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// [`quantile`] of durations.
pub fn quantile_of(v: &[Duration], q: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    if (q - 0.5).abs() < f64::EPSILON && s.len().is_multiple_of(2) {
        return (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2;
    }
    s[index(s.len(), q)]
}

fn index(len: usize, q: f64) -> usize {
    (((len as f64 - 1.0) * q).round() as usize).min(len - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0], 0.5), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.9), 5.0);
        assert_eq!(
            quantile(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9),
            9.0
        );
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert_eq!(quantile(&v, 0.9), 5.0);
    }

    #[test]
    fn quantiles_of_durations() {
        let d = |n| Duration::from_millis(n);
        assert_eq!(quantile_of(&[d(3), d(1), d(2)], 0.5), d(2));
        assert_eq!(
            quantile_of(&[d(4), d(1), d(3), d(2)], 0.5),
            Duration::from_micros(2500)
        );
        assert_eq!(quantile_of(&[d(1), d(2), d(3), d(4), d(5)], 0.9), d(5));
    }
}
