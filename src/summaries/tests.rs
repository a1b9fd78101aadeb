use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use futures_util::future::BoxFuture;

use super::*;
use crate::memory::message::Role;
use crate::metrics::JobOutcome;

/// Answers from a script, one entry per call (the last repeats), and
/// counts the calls and the most that ran at once; keeps what it was
/// asked.
struct Scripted {
    answers: Mutex<Vec<Result<&'static str, u16>>>,
    /// Every answer stopped at `max_tokens`.
    cut_off: bool,
    asked: Mutex<Vec<Ask>>,
    calls: AtomicUsize,
    running: AtomicUsize,
    most: AtomicUsize,
    delay: Duration,
}

impl Scripted {
    fn new(answers: Vec<Result<&'static str, u16>>, delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers),
            cut_off: false,
            asked: Mutex::default(),
            calls: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            delay: Duration::from_millis(delay_ms),
        })
    }

    fn cut_off(answer: &'static str) -> Arc<Self> {
        let mut s = Arc::into_inner(Self::new(vec![Ok(answer)], 0)).unwrap();
        s.cut_off = true;
        Arc::new(s)
    }
}

impl ChatModel for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn complete<'a>(&'a self, ask: &'a Ask) -> BoxFuture<'a, Result<Answer, ModelError>> {
        Box::pin(async move {
            self.asked.lock().unwrap().push(ask.clone());
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            let answer = {
                let mut a = self.answers.lock().unwrap();
                if a.len() > 1 {
                    a.remove(0)
                } else {
                    a[0]
                }
            };
            answer
                .map(|text| Answer {
                    text: text.to_owned(),
                    cut_off: self.cut_off,
                })
                .map_err(|status| ModelError::Status {
                    status,
                    message: "scripted".into(),
                })
        })
    }
}

fn fold() -> Fold {
    Fold {
        from: 0,
        until: 2,
        epoch: 0,
        born: 0,
        previous: None,
        messages: vec![
            Arc::new(Message::new(Role::User, "My name is Ada.")),
            Arc::new(Message::new(Role::Assistant, "Hello Ada.")),
        ],
    }
}

fn summarizer(model: Arc<Scripted>, config: MemoryConfig) -> (Summarizer, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    (
        Summarizer::new(config, model, Arc::clone(&metrics)),
        metrics,
    )
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_are_retried_then_given_up_and_nothing_else_is_kept() {
    let model = Scripted::new(vec![Err(500), Ok("  "), Ok("Ada.")], 0);
    let (s, metrics) = summarizer(Arc::clone(&model), MemoryConfig::default());
    // A 500, then an empty answer, then a summary: the third attempt.
    let written = s.fold(&fold()).await.unwrap();
    assert_eq!(written.text, "Ada.");
    assert!(written.covered_tokens > 0);
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);
    assert_eq!(metrics.memory.jobs(Job::Fold, JobOutcome::Failed), 2);

    // An answer over summary_max_chars is no summary, on every attempt.
    let long = Scripted::new(vec![Ok("far too long for the limit")], 0);
    let config = MemoryConfig {
        summary_max_chars: 10,
        ..MemoryConfig::default()
    };
    let (s, metrics) = summarizer(Arc::clone(&long), config);
    let err = s.fold(&fold()).await.unwrap_err();
    assert!(matches!(err, ModelError::Rejected(_)), "{err}");
    assert_eq!(long.calls.load(Ordering::SeqCst), 3);
    assert_eq!(metrics.memory.jobs(Job::Fold, JobOutcome::GaveUp), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_takes_too_long_is_a_failure() {
    let slow = Scripted::new(vec![Ok("late")], 5_000);
    let config = MemoryConfig {
        summary_timeout_secs: 1,
        summary_attempts: 1,
        ..MemoryConfig::default()
    };
    let (s, _) = summarizer(slow, config);
    let err = s.fold(&fold()).await.unwrap_err();
    assert!(matches!(err, ModelError::Timeout(1)), "{err}");
}

#[tokio::test(start_paused = true)]
async fn jobs_run_at_most_summary_concurrency_at_once() {
    let model = Scripted::new(vec![Ok("s")], 100);
    let config = MemoryConfig {
        summary_concurrency: 2,
        ..MemoryConfig::default()
    };
    let (s, _) = summarizer(Arc::clone(&model), config);
    let f = fold();
    let jobs: Vec<_> = (0..6).map(|_| s.fold(&f)).collect();
    for r in futures_util::future::join_all(jobs).await {
        assert_eq!(r.unwrap().text, "s");
    }
    assert_eq!(model.calls.load(Ordering::SeqCst), 6);
    assert_eq!(model.most.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn folds_and_notes_ask_for_at_most_their_max_tokens() {
    let model = Scripted::new(vec![Ok("Ada.")], 0);
    let (s, _) = summarizer(Arc::clone(&model), MemoryConfig::default());
    s.fold(&fold()).await.unwrap();
    s.note(None, "Ada.").await.unwrap();
    let config = MemoryConfig {
        summary_max_chars: 300,
        summary_max_tokens: Some(77),
        carry_over_max_chars: 150,
        ..MemoryConfig::default()
    };
    let (s, _) = summarizer(Arc::clone(&model), config);
    s.fold(&fold()).await.unwrap();
    s.note(None, "Ada.").await.unwrap();
    let asked: Vec<(u32, bool)> = model
        .asked
        .lock()
        .unwrap()
        .iter()
        .map(|a| (a.max_tokens, a.shape.is_some()))
        .collect();
    // 4,000 characters / 3 + 64; a note's 2 x 2,000 likewise; then the
    // key as set, and 2 x 150 / 3 + 64. No shape: summaries are text.
    assert_eq!(
        asked,
        [(1398, false), (1398, false), (77, false), (164, false)]
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_cut_off_at_max_tokens_is_not_a_summary() {
    let model = Scripted::cut_off("Ada likes tea and");
    let (s, metrics) = summarizer(Arc::clone(&model), MemoryConfig::default());
    let err = s.fold(&fold()).await.unwrap_err();
    assert!(
        matches!(err, ModelError::Rejected(summary::Rejected::CutOff)),
        "{err}"
    );
    let err = s.note(None, "Ada.").await.unwrap_err();
    assert!(
        matches!(err, ModelError::Rejected(summary::Rejected::CutOff)),
        "{err}"
    );
    assert_eq!(metrics.memory.jobs(Job::Fold, JobOutcome::GaveUp), 1);
    assert_eq!(metrics.memory.jobs(Job::Note, JobOutcome::GaveUp), 1);
}
