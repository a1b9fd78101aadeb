//! A background job's model call under its upstream's `max_concurrent`.
//!
//! `Runner::run` makes each try of a call inside `Try::run`, which marks
//! the task; `slot`, where a model call takes its place under the limit,
//! finds the mark and takes a background slot (`Gate::background`): one
//! given only while no live request waits, and asked back when one does.
//! A call made outside a job (none is, today) takes a live slot.
//!
//! The job's timeout measures the model's time, not the queue's: its clock
//! stops while the call waits for a slot, so that a patient job does not
//! fail because live turns kept the upstream busy. The waits are bounded
//! apart, as a live request's are, by the upstream's `timeout_secs`: in all,
//! over one attempt's tries; past it the attempt fails (`upstream_busy`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::UpstreamError;
use crate::proxy::cut::Cut;
use crate::proxy::gate::Slot;
use crate::proxy::upstream::Upstream;

tokio::task_local! {
    static TRY: Arc<Try>;
}

/// One try of a background job's model call.
pub(super) struct Try {
    /// Cut when a live request needs the slot this try holds.
    ask: Arc<Cut>,
    /// Whether the call waits for a slot now.
    queued: watch::Sender<bool>,
    /// What the attempt's earlier tries waited for slots.
    earlier: Duration,
    /// What this try waited for slots.
    waited: Mutex<Duration>,
}

/// Why a try ended without the call's output.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stopped {
    /// A live request needed its slot: the call is dropped, its
    /// connection closed, and it is made again from the start.
    Yielded,
    /// The model's time passed the job's timeout.
    TimedOut,
}

impl Try {
    /// A try of an attempt whose earlier tries waited `earlier` for slots.
    pub(super) fn new(earlier: Duration) -> Arc<Self> {
        Arc::new(Self {
            ask: Arc::default(),
            queued: watch::Sender::new(false),
            earlier,
            waited: Mutex::default(),
        })
    }

    fn waited_mut(&self) -> std::sync::MutexGuard<'_, Duration> {
        self.waited.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What this try waited for slots.
    pub(super) fn waited(&self) -> Duration {
        *self.waited_mut()
    }

    /// `call`'s output, unless a live request asks for the slot it holds
    /// first, or its time not spent waiting for a slot passes `timeout`.
    pub(super) async fn run<F: Future>(
        self: &Arc<Self>,
        timeout: Duration,
        call: F,
    ) -> Result<F::Output, Stopped> {
        let call = TRY.scope(Arc::clone(self), call);
        tokio::pin!(call);
        let mut asked = self.ask.wait();
        let mut queued = self.queued.subscribe();
        let mut left = timeout;
        loop {
            let waiting = *queued.borrow_and_update();
            let since = Instant::now();
            let clock = async {
                if waiting {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(left).await;
            };
            tokio::select! {
                biased;
                out = &mut call => return Ok(out),
                _ = &mut asked => return Err(Stopped::Yielded),
                // The sender lives in `self`: this never errs.
                _ = queued.changed() => {
                    if !waiting {
                        left = left.saturating_sub(since.elapsed());
                    }
                }
                _ = clock => return Err(Stopped::TimedOut),
            }
        }
    }
}

/// A slot under `upstream`'s `max_concurrent` for a model call: in a
/// background job's try, a background slot, within what is left of the
/// upstream's `timeout_secs` for the attempt's waits; else a live one.
pub(super) async fn slot(upstream: &Upstream) -> Result<Option<Slot>, UpstreamError> {
    let Ok(this) = TRY.try_with(Arc::clone) else {
        return upstream.slot().await;
    };
    let within = upstream
        .timeout()
        .saturating_sub(this.earlier + this.waited());
    this.queued.send_replace(true);
    let started = Instant::now();
    let slot = upstream
        .background_slot(Arc::clone(&this.ask), within)
        .await;
    *this.waited_mut() += started.elapsed();
    this.queued.send_replace(false);
    slot
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call of `model` seconds of the model's time around `queue` s of
    /// waiting for a slot.
    async fn call(this: &Arc<Try>, model: (u64, u64), queue: u64) {
        tokio::time::sleep(Duration::from_secs(model.0)).await;
        this.queued.send_replace(true);
        tokio::time::sleep(Duration::from_secs(queue)).await;
        this.queued.send_replace(false);
        tokio::time::sleep(Duration::from_secs(model.1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_model_clock_stops_while_the_call_waits_for_a_slot() {
        let within = Duration::from_secs(15);
        let this = Try::new(Duration::ZERO);
        let out = this.run(within, call(&this, (6, 8), 50)).await;
        assert_eq!(out, Ok(()), "14 s of the model's time");
        let this = Try::new(Duration::ZERO);
        let out = this.run(within, call(&this, (6, 10), 50)).await;
        assert_eq!(out, Err(Stopped::TimedOut), "16 s of the model's time");
    }

    #[tokio::test]
    async fn an_ask_for_the_slot_stops_the_call() {
        let this = Try::new(Duration::ZERO);
        let ask = Arc::clone(&this.ask);
        let call = async move {
            ask.cut();
            std::future::pending::<()>().await;
        };
        let out = this.run(Duration::from_secs(60), call).await;
        assert_eq!(out, Err(Stopped::Yielded));
    }
}
