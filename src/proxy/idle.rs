//! An upstream body with a limit on silence (`read_timeout_secs`).
//!
//! A timeout per read (as reqwest's read timeout was) does the same, but
//! creates, registers and drops a timer for every frame: at 2,000 streams
//! a second of 50 chunks, 100,000 timer-wheel insertions and removals a
//! second. This keeps one timer per body, armed only while a read waits,
//! and moves it only when it fires early.
//!
//! Silence is counted from when a read starts waiting, not from the last
//! frame: a streamed body is read only as fast as its client takes it, and a
//! client that paused must not make a live upstream look silent.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::{Instant, Sleep};

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the upstream sent nothing for {} s (read_timeout_secs)", .0.as_secs())]
    Idle(Duration),
    #[error(transparent)]
    Broke(hyper::Error),
    /// A whole answer past recall's cap (`relay::read_whole`).
    #[error("an answer larger than {} MiB", .0 >> 20)]
    TooLarge(usize),
}

pub struct IdleLimit<S> {
    inner: S,
    limit: Duration,
    /// When the read under way began to wait; `None` after a frame.
    waiting_since: Option<Instant>,
    /// Set on the first read that has to wait.
    timer: Option<Pin<Box<Sleep>>>,
    timed_out: bool,
}

impl<S> IdleLimit<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            waiting_since: None,
            timer: None,
            timed_out: false,
        }
    }
}

impl<S> Stream for IdleLimit<S>
where
    S: Stream<Item = Result<Bytes, hyper::Error>> + Unpin,
{
    type Item = Result<Bytes, BodyError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(None);
        }
        if let Poll::Ready(item) = Pin::new(&mut this.inner).poll_next(cx) {
            this.waiting_since = None;
            return Poll::Ready(item.map(|r| r.map_err(BodyError::Broke)));
        }
        let since = *this.waiting_since.get_or_insert_with(Instant::now);
        let due = since + this.limit;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // It fired for a deadline that reads since have moved on.
            let due = since + this.limit;
            if due <= Instant::now() {
                this.timed_out = true;
                return Poll::Ready(Some(Err(BodyError::Idle(this.limit))));
            }
            timer.as_mut().reset(due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn chunks(
        gaps_ms: &'static [u64],
    ) -> Pin<Box<dyn Stream<Item = Result<Bytes, hyper::Error>> + Send>> {
        Box::pin(futures_util::stream::iter(gaps_ms).then(|ms| async move {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            Ok(Bytes::from_static(b"x"))
        }))
    }

    // Real time, with margins of hundreds of milliseconds for a slow
    // machine: the limit is 400 ms.
    const LIMIT: Duration = Duration::from_millis(400);

    #[tokio::test]
    async fn reads_closer_together_than_the_limit_never_time_out() {
        // 8 reads 100 ms apart take 800 ms, twice the limit.
        let mut body = IdleLimit::new(chunks(&[100; 8]), LIMIT);
        let mut n = 0;
        while let Some(item) = body.next().await {
            item.unwrap();
            n += 1;
        }
        assert_eq!(n, 8);
    }

    #[tokio::test]
    async fn a_silence_longer_than_the_limit_ends_the_body() {
        let mut body = IdleLimit::new(chunks(&[300, 300, 5_000]), LIMIT);
        assert!(body.next().await.unwrap().is_ok());
        assert!(body.next().await.unwrap().is_ok());
        let started = Instant::now();
        let err = body.next().await.unwrap().unwrap_err();
        assert!(matches!(err, BodyError::Idle(_)), "{err}");
        // The limit counts from the last read, not from the first.
        let waited = started.elapsed();
        let margin = Duration::from_millis(50);
        assert!(
            waited + margin >= LIMIT && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        assert!(body.next().await.is_none(), "nothing after the timeout");
    }

    #[tokio::test]
    async fn a_reader_that_paused_longer_than_the_limit_is_not_timed_out() {
        // A streamed body is read at its client's pace: the client paused
        // for 600 ms, then the upstream took 100 ms for its next frame.
        let mut body = IdleLimit::new(chunks(&[0, 100, 100]), LIMIT);
        assert!(body.next().await.unwrap().is_ok());
        assert!(body.next().await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(body.next().await.unwrap().is_ok());
        assert!(body.next().await.is_none());
    }
}
