//! What the proxy measures about itself, served at `GET /metrics` in the
//! Prometheus text format.
//!
//! One `Metrics` per `App`, with a registry of its own (no global
//! recorder), so that several apps in one process (the tests) never mix
//! their figures. Label values come from the config or from a fixed set;
//! never from a request, so a client cannot grow the label space (and no
//! secret can end up in a label).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod cause;
mod memory;
mod reading;

pub use cause::Cause;
pub use memory::{Job, JobOutcome, LeftOut, MemoryMetrics, RecordChange};
pub use reading::{Buckets, Reading};

use recall_core::memory::reconcile::Rewrite;
use recall_core::memory::window::{TrimReason, TrimScope};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub status: u16,
    /// Empty for routes that call no upstream.
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    stream: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrimLabels {
    scope: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    /// The families `reading` parses, apart from the rest so that a reading
    /// encodes only them.
    readable: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Histograms<RequestLabels>,
    overhead_seconds: Histograms<StreamLabels>,
    upstream_seconds: Histograms<UpstreamLabels>,
    upstream_ttft_seconds: Histograms<UpstreamLabels>,
    upstream_errors: Family<UpstreamLabels, Counter>,
    active_sessions: Gauge,
    stored_messages: Gauge,
    trimmed: Family<TrimLabels, Counter>,
    interruptions: Family<CauseLabels, Counter>,
    rewritten: Family<ReasonLabels, Counter>,
    drains: Family<OutcomeLabels, Counter>,
    cache: Family<OutcomeLabels, Counter>,
    webhook: Family<OutcomeLabels, Counter>,
    sessions_ended: Counter,
    storage_write_seconds: Histograms<BackendLabels>,
    storage_not_replicated: Counter,
    /// The running summary and carry-over.
    pub memory: MemoryMetrics,
}

pub(crate) fn latency() -> Histogram {
    // 0.5 ms to about 33 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

fn fine_latency() -> Histogram {
    // 20 µs to about 0.3 s: the proxy's own time, and storage writes.
    Histogram::new(exponential_buckets(0.00002, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("recall");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by route, status and upstream",
            requests.clone(),
        );
        let request_seconds =
            Histograms::<RequestLabels>::new_with_constructor(latency as fn() -> _);
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response head (a whole non-streaming reply)",
            request_seconds.clone(),
        );
        let overhead_seconds =
            Histograms::<StreamLabels>::new_with_constructor(fine_latency as fn() -> _);
        registry.register(
            "overhead_seconds",
            "The proxy's own time on a chat completion: before the upstream call, and from the upstream's answer to the client's response head",
            overhead_seconds.clone(),
        );
        let upstream_seconds =
            Histograms::<UpstreamLabels>::new_with_constructor(latency as fn() -> _);
        registry.register(
            "upstream_duration_seconds",
            "Time from the upstream call to its response head (a whole non-streaming reply)",
            upstream_seconds.clone(),
        );
        let upstream_ttft_seconds =
            Histograms::<UpstreamLabels>::new_with_constructor(latency as fn() -> _);
        registry.register(
            "upstream_time_to_first_token_seconds",
            "Time from the upstream call to the first streamed event that carries content",
            upstream_ttft_seconds.clone(),
        );
        let upstream_errors = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "upstream_errors",
            "Upstream calls that failed: no connection, an error status, or a broken stream",
            upstream_errors.clone(),
        );
        let active_sessions = Gauge::default();
        registry.register(
            "active_sessions",
            "Sessions held in this process's memory",
            active_sessions.clone(),
        );
        let stored_messages = Gauge::default();
        registry.register(
            "stored_messages",
            "Messages held by the sessions in this process's memory",
            stored_messages.clone(),
        );
        let trimmed = Family::<TrimLabels, Counter>::default();
        registry.register(
            "trimmed_messages",
            "Messages left out of a window (scope=window) or dropped from a session (scope=history), by reason",
            trimmed.clone(),
        );
        let interruptions = Family::<CauseLabels, Counter>::default();
        registry.register(
            "interruptions",
            "Replies cut off, by cause",
            interruptions.clone(),
        );
        let rewritten = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "superseded_messages",
            "Stored messages superseded by a request that regenerates, edits or retries (reason)",
            rewritten.clone(),
        );
        let drains = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "drains",
            "Cut-off replies read on from the upstream to record them whole, by outcome (complete, incomplete, or yielded: cut short for a live request under max_concurrent)",
            drains.clone(),
        );
        let cache = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "cache_lookups",
            "Answer cache lookups, by outcome (hit, miss)",
            cache.clone(),
        );
        let webhook = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook delivery attempts, by outcome (delivered, failed)",
            webhook.clone(),
        );
        let sessions_ended = Counter::default();
        registry.register(
            "sessions_ended",
            "Sessions ended: by the API, expiry or eviction",
            sessions_ended.clone(),
        );
        let storage_write_seconds =
            Histograms::<BackendLabels>::new_with_constructor(fine_latency as fn() -> _);
        registry.register(
            "storage_write_duration_seconds",
            "Time to make one batch of changes durable (one group commit)",
            storage_write_seconds.clone(),
        );
        let storage_not_replicated = Counter::default();
        registry.register(
            "storage_not_replicated",
            "Writes the Redis node took but too few of its replicas acknowledged in time \
             ([storage] min_replicas, replica_ack_timeout_ms): answered 503",
            storage_not_replicated.clone(),
        );
        let memory = MemoryMetrics::register(&mut registry);
        let mut readable = Registry::default();
        readable.register(reading::REQUESTS, "", requests.clone());
        readable.register(reading::OVERHEAD, "", overhead_seconds.clone());
        readable.register(reading::STORAGE, "", storage_write_seconds.clone());
        // Families with known label sets start at 0, so that a dashboard's
        // `rate()` has a series before the first event.
        use TrimReason as R;
        for (scope, reasons) in [
            (
                TrimScope::Window,
                &[R::MaxMessages, R::MaxChars, R::MaxTokens][..],
            ),
            (TrimScope::History, &[R::MaxMessages, R::MaxBytes][..]),
        ] {
            for &reason in reasons {
                trimmed.get_or_create(&trim_labels(scope, reason)).inc_by(0);
            }
        }
        for cause in Cause::ALL {
            interruptions
                .get_or_create(&CauseLabels {
                    cause: cause.label(),
                })
                .inc_by(0);
        }
        for reason in Rewrite::ALL {
            rewritten
                .get_or_create(&ReasonLabels {
                    reason: reason.label(),
                })
                .inc_by(0);
        }
        for (family, outcomes) in [
            (&drains, &["complete", "incomplete", "yielded"][..]),
            (&cache, &["hit", "miss"][..]),
            (&webhook, &["delivered", "failed"][..]),
        ] {
            for &outcome in outcomes {
                family.get_or_create(&OutcomeLabels { outcome }).inc_by(0);
            }
        }
        Self {
            registry,
            readable,
            requests,
            request_seconds,
            overhead_seconds,
            upstream_seconds,
            upstream_ttft_seconds,
            upstream_errors,
            active_sessions,
            stored_messages,
            trimmed,
            interruptions,
            rewritten,
            drains,
            cache,
            webhook,
            sessions_ended,
            storage_write_seconds,
            storage_not_replicated,
            memory,
        }
    }
}

impl Metrics {
    /// The configured upstreams' error counters, at 0 until their first error.
    pub fn preset_upstreams<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for upstream in names {
            self.upstream_errors
                .get_or_create(&UpstreamLabels {
                    upstream: upstream.to_owned(),
                })
                .inc_by(0);
        }
    }

    /// The text exposition, with the session gauges set from `sessions`
    /// and `messages` first.
    pub fn render(&self, sessions: usize, messages: usize) -> String {
        self.active_sessions.set(sessions as i64);
        self.stored_messages.set(messages as i64);
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "could not encode the metrics");
        }
        out
    }

    pub fn request(&self, labels: &RequestLabels, took: Duration) {
        self.requests.get_or_create(labels).inc();
        self.request_seconds
            .get_or_create(labels)
            .observe(took.as_secs_f64());
    }

    pub fn overhead(&self, stream: bool, took: Duration) {
        self.overhead_seconds
            .get_or_create(&StreamLabels { stream })
            .observe(took.as_secs_f64());
    }

    pub fn upstream(&self, upstream: &str, took: Duration) {
        self.upstream_seconds
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn first_token(&self, upstream: &str, took: Duration) {
        self.upstream_ttft_seconds
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn upstream_error(&self, upstream: &str) {
        self.upstream_errors
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
            })
            .inc();
    }

    pub fn add_trimmed(&self, scope: TrimScope, reason: TrimReason, n: usize) {
        self.trimmed
            .get_or_create(&trim_labels(scope, reason))
            .inc_by(n as u64);
    }

    pub fn trimmed(&self, scope: TrimScope, reason: TrimReason) -> u64 {
        self.trimmed
            .get_or_create(&trim_labels(scope, reason))
            .get()
    }

    /// Messages left out of upstream windows, for any reason.
    pub fn trimmed_sent(&self) -> u64 {
        [
            TrimReason::MaxMessages,
            TrimReason::MaxChars,
            TrimReason::MaxTokens,
        ]
        .into_iter()
        .map(|r| self.trimmed(TrimScope::Window, r))
        .sum()
    }

    /// Messages dropped from sessions over `max_messages` or `max_bytes`.
    pub fn trimmed_kept(&self) -> u64 {
        self.trimmed(TrimScope::History, TrimReason::MaxMessages)
            + self.trimmed(TrimScope::History, TrimReason::MaxBytes)
    }

    pub fn superseded(&self, reason: &'static str, n: usize) {
        self.rewritten
            .get_or_create(&ReasonLabels { reason })
            .inc_by(n as u64);
    }

    pub fn interrupted(&self, cause: Cause) {
        self.interruptions
            .get_or_create(&CauseLabels {
                cause: cause.label(),
            })
            .inc();
    }

    pub fn interruptions(&self, cause: Cause) -> u64 {
        self.interruptions
            .get_or_create(&CauseLabels {
                cause: cause.label(),
            })
            .get()
    }

    /// A drain ended: the upstream finished the reply, or it was given up
    /// (timeout, size limit, or the upstream broke).
    pub fn drained(&self, complete: bool, yielded: bool) {
        let outcome = match (complete, yielded) {
            (true, _) => "complete",
            (false, true) => "yielded",
            (false, false) => "incomplete",
        };
        self.drains.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn cache_lookup(&self, hit: bool) {
        let outcome = if hit { "hit" } else { "miss" };
        self.cache.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn cache_hits(&self) -> u64 {
        self.cache
            .get_or_create(&OutcomeLabels { outcome: "hit" })
            .get()
    }

    pub fn webhook_attempt(&self, delivered: bool) {
        let outcome = if delivered { "delivered" } else { "failed" };
        self.webhook.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn session_ended(&self) {
        self.sessions_ended.inc();
    }

    pub fn sessions_ended(&self) -> u64 {
        self.sessions_ended.get()
    }

    /// The cumulative figures the console plots: a few read locks and a
    /// small text encoding, for a caller every few seconds.
    pub fn reading(&self) -> Reading {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.readable) {
            tracing::error!(error = %e, "could not encode the metrics for a reading");
        }
        Reading {
            interruptions: Cause::ALL.into_iter().map(|c| self.interruptions(c)).sum(),
            trimmed_sent: self.trimmed_sent(),
            trimmed_kept: self.trimmed_kept(),
            summary_jobs: self.memory.ended(false),
            long_term_jobs: self.memory.ended(true),
            failed_attempts: self.memory.failed_attempts(),
            ..reading::parse(&text)
        }
    }
}

impl recall_store::StorageMetrics for Metrics {
    fn storage_not_replicated(&self) -> Counter {
        self.storage_not_replicated.clone()
    }

    fn storage_writes(&self, backend: &'static str) -> Histogram {
        self.storage_write_seconds
            .get_or_create(&BackendLabels { backend })
            .clone()
    }
}

fn trim_labels(scope: TrimScope, reason: TrimReason) -> TrimLabels {
    TrimLabels {
        scope: match scope {
            TrimScope::Window => "window",
            TrimScope::History => "history",
        },
        reason: match reason {
            TrimReason::MaxMessages => "max_messages",
            TrimReason::MaxChars => "max_chars",
            TrimReason::MaxTokens => "max_tokens",
            TrimReason::MaxBytes => "max_bytes",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recall_store::StorageMetrics;

    #[test]
    fn renders_prometheus_text_with_the_recall_prefix() {
        let m = Metrics::default();
        m.request(
            &RequestLabels {
                route: "/v1/chat/completions".into(),
                status: 200,
                upstream: "openai".into(),
            },
            Duration::from_millis(3),
        );
        m.interrupted(Cause::NewRequest);
        m.add_trimmed(TrimScope::Window, TrimReason::MaxMessages, 4);
        let text = m.render(2, 7);
        assert!(text.contains(
            "recall_requests_total{route=\"/v1/chat/completions\",status=\"200\",upstream=\"openai\"} 1"
        ), "{text}");
        assert!(
            text.contains("recall_request_duration_seconds_bucket{"),
            "{text}"
        );
        assert!(text.contains("recall_interruptions_total{cause=\"new_request\"} 1"));
        assert!(text
            .contains("recall_trimmed_messages_total{scope=\"window\",reason=\"max_messages\"} 4"));
        assert!(text.contains("recall_active_sessions 2"));
        assert!(text.contains("recall_stored_messages 7"));
        assert_eq!(m.trimmed_sent(), 4);
    }

    #[test]
    fn a_reading_sums_label_sets_and_keeps_cumulative_buckets() {
        let m = Metrics::default();
        for (route, status) in [
            ("/v1/chat/completions", 200),
            ("/health", 200),
            ("/x y", 404),
        ] {
            m.request(
                &RequestLabels {
                    route: route.into(),
                    status,
                    upstream: String::new(),
                },
                Duration::from_millis(1),
            );
        }
        // Bounds 20 µs, 40 µs, 80 µs, …
        m.overhead(true, Duration::from_micros(10));
        m.overhead(false, Duration::from_micros(30));
        m.overhead(false, Duration::from_secs(5));
        m.storage_writes("sqlite").observe(0.00003);
        m.interrupted(Cause::ClientGone);
        m.interrupted(Cause::NewRequest);
        m.add_trimmed(TrimScope::History, TrimReason::MaxBytes, 3);
        m.memory.job(Job::Fold, JobOutcome::Failed);
        m.memory.job(Job::Fold, JobOutcome::GaveUp);
        m.memory.job(Job::Note, JobOutcome::Stored);
        m.memory.job(Job::Extract, JobOutcome::Stale);

        let r = m.reading();
        assert_eq!(r.requests, 3);
        let o = &r.overhead_seconds;
        assert_eq!(o.count, 3);
        assert!((o.sum - 5.00004).abs() < 1e-9, "{}", o.sum);
        assert_eq!(o.le.len(), 16);
        assert_eq!(o.le[0], (0.00002, 1));
        assert_eq!(o.le[1], (0.00004, 2));
        assert_eq!(o.le[14].1, 2);
        assert_eq!(o.le[15], (f64::INFINITY, 3));
        assert_eq!(r.storage_write_seconds.count, 1);
        assert_eq!(r.storage_write_seconds.le[1], (0.00004, 1));
        assert_eq!(r.interruptions, 2);
        assert_eq!((r.trimmed_sent, r.trimmed_kept), (0, 3));
        assert_eq!((r.summary_jobs, r.long_term_jobs), (2, 1));
        assert_eq!(r.failed_attempts, 1);
    }
}
