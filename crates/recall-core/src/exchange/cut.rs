//! The moment a reply stops going to its client, as a flag and a future.
//!
//! A relayed chunk checks it (the response body, before each read), so
//! checking must cost no lock. A `CancellationToken` locks its
//! node's mutex in `is_cancelled`, on every poll of its future and on
//! every new wait, a visible share of a stream's CPU. Here a check is
//! one atomic load, and each waiter registers once and is then polled
//! through its own `AtomicWaker`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

#[derive(Default)]
pub struct Cut {
    done: AtomicBool,
    waiters: Mutex<Vec<Arc<AtomicWaker>>>,
}

impl Cut {
    pub fn is_cut(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Cuts, waking every waiter; a second call does nothing.
    pub fn cut(&self) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|e| e.into_inner()));
        for w in waiters {
            w.wake();
        }
    }

    /// A future that resolves once this is cut (at once if it is). It may
    /// be polled again after that, and resolves again.
    pub fn wait(self: &Arc<Self>) -> CutWait {
        let slot = Arc::new(AtomicWaker::new());
        if !self.is_cut() {
            self.waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::clone(&slot));
        }
        CutWait {
            cut: Arc::clone(self),
            slot,
        }
    }
}

pub struct CutWait {
    cut: Arc<Cut>,
    slot: Arc<AtomicWaker>,
}

impl Future for CutWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.cut.is_cut() {
            return Poll::Ready(());
        }
        self.slot.register(cx.waker());
        // A cut between the check and the registration took the slot's
        // old waker; this second check sees it.
        if self.cut.is_cut() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_waiter_wakes_on_the_cut_and_later_ones_resolve_at_once() {
        let cut = Arc::new(Cut::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let wait = cut.wait();
                tokio::spawn(wait)
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        assert!(!cut.is_cut());
        let c = Arc::clone(&cut);
        std::thread::spawn(move || c.cut()).join().unwrap();
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("a waiter was not woken")
                .unwrap();
        }
        assert!(cut.is_cut());
        cut.cut();
        let mut late = cut.wait();
        (&mut late).await;
        // Polled again after resolving: resolves again.
        (&mut late).await;
    }

    #[test]
    fn a_cut_racing_with_waiters_never_leaves_one_asleep() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for _ in 0..2_000 {
            let cut = Arc::new(Cut::default());
            let waiter = rt.spawn(cut.wait());
            let c = Arc::clone(&cut);
            rt.spawn(async move { c.cut() });
            rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), waiter)
                    .await
                    .expect("a waiter slept through the cut")
                    .unwrap();
            });
        }
    }
}
