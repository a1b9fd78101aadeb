//! The last hour of recall's own metrics, kept in process for the
//! Overview page's plots: a reading every few seconds (`[console]
//! sample_secs`) in a ring buffer, and the points each chart draws from
//! consecutive readings.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::{Buckets, Metrics, Reading};

/// What the charts span.
pub const HOUR_MS: i64 = 3_600_000;

/// The most readings kept: an hour of them at one a second (361 at the
/// default 10 s), however often `record` is called.
pub const MAX_READINGS: usize = 3601;

/// A reading and when it was taken.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub at_ms: i64,
    pub reading: Reading,
}

/// One interval's figures. Counts are per minute, so that a chart reads the
/// same whatever the sampling interval. A latency is `None` when nothing
/// was measured in the interval: a gap in its line, not a 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Point {
    pub requests_per_s: Option<f64>,
    pub overhead_p50_ms: Option<f64>,
    pub overhead_p99_ms: Option<f64>,
    pub interruptions: Option<f64>,
    pub trimmed_sent: Option<f64>,
    pub trimmed_kept: Option<f64>,
    pub storage_write_ms: Option<f64>,
    pub summary_jobs: Option<f64>,
    pub long_term_jobs: Option<f64>,
    pub failed_attempts: Option<f64>,
}

/// The interval from `a` to `b`, `b` the later; nothing if no time passed.
pub fn point(a: &Sample, b: &Sample) -> Point {
    let seconds = (b.at_ms - a.at_ms) as f64 / 1000.0;
    if seconds <= 0.0 {
        return Point::default();
    }
    let (a, b) = (&a.reading, &b.reading);
    // Counters only grow in one process; saturate anyway rather than plot
    // a wrapped-around figure.
    let count = |x: u64, y: u64| Some(y.saturating_sub(x) as f64 / seconds * 60.0);
    let overhead = delta(&a.overhead_seconds, &b.overhead_seconds);
    let storage = delta(&a.storage_write_seconds, &b.storage_write_seconds);
    Point {
        requests_per_s: Some(b.requests.saturating_sub(a.requests) as f64 / seconds),
        overhead_p50_ms: quantile(0.5, &overhead.le).map(|s| s * 1000.0),
        overhead_p99_ms: quantile(0.99, &overhead.le).map(|s| s * 1000.0),
        interruptions: count(a.interruptions, b.interruptions),
        trimmed_sent: count(a.trimmed_sent, b.trimmed_sent),
        trimmed_kept: count(a.trimmed_kept, b.trimmed_kept),
        storage_write_ms: (storage.count > 0).then(|| storage.sum / storage.count as f64 * 1000.0),
        summary_jobs: count(a.summary_jobs, b.summary_jobs),
        long_term_jobs: count(a.long_term_jobs, b.long_term_jobs),
        failed_attempts: count(a.failed_attempts, b.failed_attempts),
    }
}

/// What a histogram observed between two readings. A bound the earlier
/// reading lacks (its label set did not exist yet) counted 0 then.
fn delta(a: &Buckets, b: &Buckets) -> Buckets {
    let before = |bound: f64| {
        a.le.iter()
            .find(|(x, _)| *x == bound)
            .map_or(0, |&(_, c)| c)
    };
    Buckets {
        sum: (b.sum - a.sum).max(0.0),
        count: b.count.saturating_sub(a.count),
        le: b
            .le
            .iter()
            .map(|&(bound, c)| (bound, c.saturating_sub(before(bound))))
            .collect(),
    }
}

/// The `q` quantile of cumulative buckets, as Prometheus's
/// `histogram_quantile` estimates it: linear within the bucket the rank
/// falls in, from 0 for the first; the highest finite bound if it falls in
/// the infinite one. `None` without observations or finite bounds.
pub fn quantile(q: f64, le: &[(f64, u64)]) -> Option<f64> {
    let total = le.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let at = le.iter().position(|&(_, c)| c as f64 >= rank)?;
    let (upper, cumulative) = le[at];
    if upper.is_infinite() {
        return (at > 0).then(|| le[at - 1].0);
    }
    let (lower, below) = if at == 0 { (0.0, 0) } else { le[at - 1] };
    let within = cumulative - below;
    if within == 0 {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below as f64) / within as f64)
}

/// A figure on the Overview page.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub title: &'static str,
    pub unit: &'static str,
    pub lines: Vec<Line>,
}

/// One line of a chart: at the end of each interval, its value (`None`: a gap).
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub name: &'static str,
    pub points: Vec<(i64, Option<f64>)>,
}

/// A chart: its title, unit, and each line's name and value of a point.
struct Spec(&'static str, &'static str, &'static [(&'static str, Pick)]);

type Pick = fn(&Point) -> Option<f64>;

const CHARTS: &[Spec] = &[
    Spec(
        "Requests per second",
        "req/s",
        &[("requests", |p| p.requests_per_s)],
    ),
    Spec(
        "Added latency",
        "ms",
        &[
            ("p50", |p| p.overhead_p50_ms),
            ("p99", |p| p.overhead_p99_ms),
        ],
    ),
    Spec(
        "Interruptions",
        "replies/min",
        &[("cut off", |p| p.interruptions)],
    ),
    Spec(
        "Trims",
        "messages/min",
        &[
            ("left out of a window", |p| p.trimmed_sent),
            ("dropped from a session", |p| p.trimmed_kept),
        ],
    ),
    Spec(
        "Storage write time",
        "ms",
        &[("mean", |p| p.storage_write_ms)],
    ),
    Spec(
        "Summary and long-term jobs",
        "jobs/min",
        &[
            ("summary", |p| p.summary_jobs),
            ("long-term", |p| p.long_term_jobs),
            ("failed attempts", |p| p.failed_attempts),
        ],
    ),
];

/// The readings of the last hour, oldest first.
pub struct Series {
    samples: Mutex<VecDeque<Sample>>,
}

impl Default for Series {
    fn default() -> Self {
        Self::new()
    }
}

impl Series {
    pub fn new() -> Self {
        Self {
            samples: Mutex::new(VecDeque::new()),
        }
    }

    /// Takes a reading of `metrics` as at `now_ms`, dropping those no
    /// longer needed for the hour up to it.
    pub fn record(&self, now_ms: i64, metrics: &Metrics) {
        // Read before locking: the page never waits on the metrics.
        self.push(Sample {
            at_ms: now_ms,
            reading: metrics.reading(),
        });
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let since = sample.at_ms - HOUR_MS;
        samples.push_back(sample);
        // The oldest kept is the last at or before the hour's start: the
        // first interval reaches back to it.
        while samples.len() > MAX_READINGS || samples.get(1).is_some_and(|s| s.at_ms <= since) {
            samples.pop_front();
        }
    }

    /// How many readings are held.
    pub fn len(&self) -> usize {
        self.samples.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every chart, with one point per interval between readings (none
    /// before the second reading).
    pub fn charts(&self) -> Vec<Chart> {
        let points: Vec<(i64, Point)> = {
            let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            samples
                .iter()
                .zip(samples.iter().skip(1))
                .map(|(a, b)| (b.at_ms, point(a, b)))
                .collect()
        };
        CHARTS
            .iter()
            .map(|&Spec(title, unit, lines)| Chart {
                title,
                unit,
                lines: lines
                    .iter()
                    .map(|&(name, pick)| Line {
                        name,
                        points: points.iter().map(|(at, p)| (*at, pick(p))).collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Records now and then every `every`, until the series is dropped.
    pub fn spawn(
        self: &Arc<Self>,
        metrics: Arc<Metrics>,
        every: Duration,
        clock: impl Fn() -> i64 + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let series = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            // After a stall, one reading: the interval's length comes from
            // the readings' times, not from the schedule.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(series) = series.upgrade() else {
                    return;
                };
                series.record(clock(), &metrics);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(le: &[(f64, u64)], sum: f64) -> Buckets {
        Buckets {
            sum,
            count: le.last().map_or(0, |b| b.1),
            le: le.to_vec(),
        }
    }

    fn sample(at_ms: i64, requests: u64, overhead: Buckets) -> Sample {
        Sample {
            at_ms,
            reading: Reading {
                requests,
                overhead_seconds: overhead,
                ..Reading::default()
            },
        }
    }

    const INF: f64 = f64::INFINITY;

    #[test]
    fn quantiles_interpolate_within_the_bucket_like_prometheus() {
        // 2 observations ≤ 1 ms, 4 in (1, 2], 4 in (2, 4].
        let le = [(0.001, 2), (0.002, 6), (0.004, 10), (INF, 10)];
        // Rank 5: 3 into the second bucket's 4 → 1 + 1 × 3/4 ms.
        assert!((quantile(0.5, &le).unwrap() - 0.00175).abs() < 1e-12);
        // Rank 9.9: 3.9 into the third bucket's 4 → 2 + 2 × 3.9/4 ms.
        assert!((quantile(0.99, &le).unwrap() - 0.00395).abs() < 1e-12);
        // Rank 0.5 in the first bucket interpolates from 0.
        assert!((quantile(0.05, &le).unwrap() - 0.00025).abs() < 1e-12);
        // In the infinite bucket: the highest finite bound.
        assert_eq!(quantile(0.99, &[(0.001, 1), (INF, 10)]), Some(0.001));
        assert_eq!(quantile(0.5, &[(0.001, 0), (INF, 0)]), None);
        assert_eq!(quantile(0.5, &[]), None);
    }

    #[test]
    fn two_readings_make_rates_counts_and_quantiles_of_the_interval() {
        let mut a = sample(
            0,
            100,
            buckets(&[(0.001, 50), (0.002, 50), (INF, 50)], 0.02),
        );
        a.reading.interruptions = 3;
        a.reading.storage_write_seconds = buckets(&[(INF, 4)], 0.004);
        let mut b = sample(
            10_000,
            150,
            // This interval alone: 2 ≤ 1 ms, 2 in (1, 2].
            buckets(&[(0.001, 52), (0.002, 54), (INF, 54)], 0.026),
        );
        b.reading.interruptions = 5;
        b.reading.storage_write_seconds = buckets(&[(INF, 6)], 0.010);
        b.reading.long_term_jobs = 1;
        let p = point(&a, &b);
        assert_eq!(p.requests_per_s, Some(5.0));
        // Rank 2 of 4: the first bucket's top.
        assert!((p.overhead_p50_ms.unwrap() - 1.0).abs() < 1e-9);
        // Rank 3.96: 1.96 into the second bucket's 2.
        assert!((p.overhead_p99_ms.unwrap() - 1.98).abs() < 1e-9);
        // 2 in 10 s.
        assert_eq!(p.interruptions, Some(12.0));
        assert!((p.storage_write_ms.unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(p.long_term_jobs, Some(6.0));
        assert_eq!(p.trimmed_sent, Some(0.0));
    }

    #[test]
    fn an_interval_without_requests_is_a_gap_in_latency_not_a_zero() {
        let h = buckets(&[(0.001, 5), (INF, 5)], 0.003);
        let p = point(&sample(0, 9, h.clone()), &sample(10_000, 9, h));
        assert_eq!(p.requests_per_s, Some(0.0));
        assert_eq!((p.overhead_p50_ms, p.overhead_p99_ms), (None, None));
        assert_eq!(p.storage_write_ms, None);
        assert_eq!(p.interruptions, Some(0.0));
        // A family with no label set yet, then its first observation.
        let first = buckets(&[(0.001, 1), (INF, 1)], 0.0005);
        let p = point(&sample(0, 0, Buckets::default()), &sample(10_000, 1, first));
        assert!((p.overhead_p50_ms.unwrap() - 0.5).abs() < 1e-9);
        // No time passed: nothing to say.
        assert_eq!(
            point(
                &sample(5, 0, Buckets::default()),
                &sample(5, 1, Buckets::default())
            ),
            Point::default()
        );
    }

    #[test]
    fn the_ring_keeps_an_hour_of_readings_and_charts_their_intervals() {
        let series = Series::new();
        assert!(series
            .charts()
            .iter()
            .all(|c| c.lines.iter().all(|l| l.points.is_empty())));
        for i in 0..400 {
            series.push(sample(i * 10_000, i as u64 * 20, Buckets::default()));
        }
        assert_eq!(series.len(), 361);
        let charts = series.charts();
        let titles: Vec<_> = charts.iter().map(|c| c.title).collect();
        assert_eq!(
            titles,
            [
                "Requests per second",
                "Added latency",
                "Interruptions",
                "Trims",
                "Storage write time",
                "Summary and long-term jobs"
            ]
        );
        let requests = &charts[0].lines[0].points;
        assert_eq!(requests.len(), 360);
        // The oldest kept reading is the 40th: its interval ends at the 41st.
        assert_eq!(requests[0], (40 * 10_000, Some(2.0)));
        assert_eq!(requests.last(), Some(&(399 * 10_000, Some(2.0))));
        assert_eq!(charts[1].lines.len(), 2);
        assert!(charts[1].lines[1].points.iter().all(|p| p.1.is_none()));
    }

    #[test]
    fn an_hour_is_kept_whatever_the_interval_up_to_a_bound() {
        for (every_ms, pushes, kept) in [
            (60_000, 100, 61),
            (1_000, 7_200, 3_601),
            (100, 50_000, MAX_READINGS),
            // Uneven: the oldest kept is the last at or before the hour.
            (1_900_000, 4, 3),
        ] {
            let series = Series::new();
            for i in 0..pushes {
                series.push(sample(i * every_ms, 0, Buckets::default()));
            }
            assert_eq!(series.len(), kept, "every {every_ms} ms");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn spawned_readings_come_every_interval_and_stop_with_the_series() {
        let series = Arc::new(Series::new());
        let metrics = Arc::new(Metrics::default());
        let every = Duration::from_secs(10);
        let task = series.spawn(metrics, every, || 0);
        tokio::time::sleep(every * 3 + Duration::from_millis(1)).await;
        assert_eq!(series.len(), 4);
        drop(series);
        tokio::time::sleep(every).await;
        assert!(task.is_finished());
    }
}
