//! The cumulative figures the console plots, read back from the metrics.
//!
//! prometheus-client keeps a histogram's buckets to itself except through
//! its text encoding, so a second registry holds the few families a reading
//! needs and `parse` reads what it encodes. That runs every few seconds off
//! the request path, under the same read locks a scrape takes; the request
//! path gains nothing.

/// A histogram summed over its label sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets {
    /// Of the observations, in the histogram's unit (seconds).
    pub sum: f64,
    pub count: u64,
    /// (upper bound, cumulative count), by bound; the last bound is infinite.
    /// Empty until the first label set exists.
    pub le: Vec<(f64, u64)>,
}

/// Cumulative counts since the process started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    /// HTTP requests answered, of every route.
    pub requests: u64,
    /// The proxy's own time on chat completions.
    pub overhead_seconds: Buckets,
    /// Group commits of the storage backend.
    pub storage_write_seconds: Buckets,
    /// Replies cut off, of every cause.
    pub interruptions: u64,
    /// Messages left out of upstream windows.
    pub trimmed_sent: u64,
    /// Messages dropped from sessions.
    pub trimmed_kept: u64,
    /// Summary model jobs ended (stored, stale or given up).
    pub summary_jobs: u64,
    /// Long-term memory jobs ended (stored, stale or given up).
    pub long_term_jobs: u64,
    /// Failed model calls of background jobs, each retry counted.
    pub failed_attempts: u64,
}

/// The names the readable registry gives its families (no prefix).
pub(super) const REQUESTS: &str = "requests";
pub(super) const OVERHEAD: &str = "overhead_seconds";
pub(super) const STORAGE: &str = "storage_write_seconds";

/// The counters and histograms of a text exposition of the readable
/// registry; anything else is left at 0.
pub(super) fn parse(text: &str) -> Reading {
    let mut r = Reading::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, rest) = line.split_at(line.find(['{', ' ']).unwrap_or(line.len()));
        // No exemplars or timestamps are encoded: the value comes last.
        let value = rest.rsplit(' ').next().unwrap_or("");
        if name.strip_suffix("_total") == Some(REQUESTS) {
            r.requests += value.parse::<u64>().unwrap_or(0);
            continue;
        }
        let (h, suffix) = if let Some(s) = suffix_of(name, OVERHEAD) {
            (&mut r.overhead_seconds, s)
        } else if let Some(s) = suffix_of(name, STORAGE) {
            (&mut r.storage_write_seconds, s)
        } else {
            continue;
        };
        match suffix {
            "sum" => h.sum += value.parse::<f64>().unwrap_or(0.0),
            "count" => h.count += value.parse::<u64>().unwrap_or(0),
            "bucket" => {
                let (Some(le), Ok(n)) = (le(rest), value.parse::<u64>()) else {
                    continue;
                };
                // Every label set of a family has the same bounds, and the
                // shortest decimal of a bound parses back to the same f64.
                match h.le.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += n,
                    None => h.le.push((le, n)),
                }
            }
            _ => {}
        }
    }
    for h in [&mut r.overhead_seconds, &mut r.storage_write_seconds] {
        h.le.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    r
}

fn suffix_of<'a>(name: &'a str, family: &str) -> Option<&'a str> {
    name.strip_prefix(family)?.strip_prefix('_')
}

fn le(labels: &str) -> Option<f64> {
    let at = labels.find("le=\"")? + 4;
    let end = at + labels[at..].find('"')?;
    match &labels[at..end] {
        "+Inf" => Some(f64::INFINITY),
        v => v.parse().ok(),
    }
}
