//! How many requests recall has open to one upstream (`max_concurrent`),
//! live turns first.
//!
//! A local model server has few slots (llama.cpp's has one by default).
//! The drain of a cut reply keeps its connection open to record the
//! complete original, and would hold that slot while the user's next turn,
//! the one they are waiting for, queues behind it inside the server. Here a
//! drain holds its slot only while no live request waits: a live request
//! that finds no slot free tells the oldest drain to yield, and takes its
//! slot once the drain has closed its connection. Live requests past the
//! limit wait in order.
//!
//! Slots pass from a holder to the next waiter directly, so that a request
//! arriving meanwhile cannot take a slot out of turn.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::proxy::cut::{Cut, CutWait};

pub struct Gate {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Slots held, live or draining.
    open: usize,
    /// Live requests waiting for a slot, oldest first.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
    next_id: u64,
    /// Drains holding a slot, not yet told to yield, oldest first.
    draining: VecDeque<Arc<Cut>>,
    /// Drains told to yield that still hold their slot: each is already
    /// promised to a waiter.
    yielding: usize,
}

impl State {
    /// Tells drains to yield until every waiter has one promised.
    fn promise_slots(&mut self) {
        while self.waiting.len() > self.yielding {
            let Some(drain) = self.draining.pop_front() else {
                return;
            };
            drain.cut();
            self.yielding += 1;
        }
    }
}

impl Gate {
    /// A gate of `limit` slots; `limit` must be above 0.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            state: Mutex::default(),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a live request: at once if one is free, else after the
    /// requests that waited before it. Dropping the future gives up its
    /// place.
    pub fn acquire(self: &Arc<Self>) -> Acquire {
        let mut st = self.lock();
        if st.open < self.limit {
            st.open += 1;
            return Acquire::Ready(Some(Slot::new(self)));
        }
        let (tx, rx) = oneshot::channel();
        let id = st.next_id;
        st.next_id += 1;
        st.waiting.push_back((id, tx));
        st.promise_slots();
        Acquire::Waiting(Waiter {
            gate: Arc::clone(self),
            id,
            rx: Some(rx),
        })
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// A slot's holder is done with it: it goes to the oldest waiter still
    /// there, or back to the free ones.
    fn release(&self, drain: Option<&Arc<Cut>>) {
        let mut st = self.lock();
        if let Some(drain) = drain {
            match st.draining.iter().position(|d| Arc::ptr_eq(d, drain)) {
                Some(i) => {
                    st.draining.remove(i);
                }
                None => st.yielding = st.yielding.saturating_sub(1),
            }
        }
        while let Some((_, tx)) = st.waiting.pop_front() {
            if tx.send(()).is_ok() {
                return;
            }
        }
        st.open = st.open.saturating_sub(1);
    }
}

/// One slot, held until dropped.
pub struct Slot {
    gate: Arc<Gate>,
    /// Set while the holder drains a cut reply: cut when a live request
    /// needs the slot.
    drain: Option<Arc<Cut>>,
}

impl Slot {
    fn new(gate: &Arc<Gate>) -> Self {
        Self {
            gate: Arc::clone(gate),
            drain: None,
        }
    }

    /// The holder now drains a reply nobody waits for: the slot may be
    /// asked back. The returned future resolves when it is, at once if a
    /// live request already waits.
    pub fn draining(&mut self) -> CutWait {
        if let Some(drain) = &self.drain {
            return drain.wait();
        }
        let drain = Arc::new(Cut::default());
        let mut st = self.gate.lock();
        st.draining.push_back(Arc::clone(&drain));
        st.promise_slots();
        drop(st);
        let wait = drain.wait();
        self.drain = Some(drain);
        wait
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.release(self.drain.as_ref());
    }
}

pub enum Acquire {
    Ready(Option<Slot>),
    Waiting(Waiter),
}

impl Future for Acquire {
    type Output = Slot;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Slot> {
        match self.get_mut() {
            Acquire::Ready(slot) => match slot.take() {
                Some(slot) => Poll::Ready(slot),
                None => Poll::Pending,
            },
            Acquire::Waiting(w) => Pin::new(w).poll(cx),
        }
    }
}

pub struct Waiter {
    gate: Arc<Gate>,
    id: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Future for Waiter {
    type Output = Slot;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Slot> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Pending;
        };
        // The gate keeps every sender until it hands the slot over, so
        // the only outcome is a slot.
        let _ = std::task::ready!(Pin::new(rx).poll(cx));
        self.rx = None;
        Poll::Ready(Slot::new(&self.gate))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        if rx.try_recv().is_ok() {
            // Handed a slot just before giving up: pass it on.
            self.gate.release(None);
            return;
        }
        let mut st = self.gate.lock();
        if let Some(i) = st.waiting.iter().position(|(id, _)| *id == self.id) {
            st.waiting.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn soon<F: Future>(f: F) -> Option<F::Output> {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .ok()
    }

    #[tokio::test]
    async fn slots_up_to_the_limit_are_free_and_the_next_waits_for_one() {
        let gate = Gate::new(2);
        let a = soon(gate.acquire()).await.expect("free");
        let _b = soon(gate.acquire()).await.expect("free");
        let mut c = Box::pin(gate.acquire());
        assert!(soon(&mut c).await.is_none());
        assert_eq!(gate.waiting(), 1);
        drop(a);
        assert!(soon(&mut c).await.is_some());
        assert_eq!(gate.waiting(), 0);
    }

    #[tokio::test]
    async fn waiters_are_served_in_order_and_a_slot_is_never_taken_out_of_turn() {
        let gate = Gate::new(1);
        let held = gate.acquire().await;
        let mut first = Box::pin(gate.acquire());
        let mut second = Box::pin(gate.acquire());
        assert!(soon(&mut second).await.is_none());
        assert!(soon(&mut first).await.is_none());
        drop(held);
        // Handed to the first waiter: a newcomer finds none free.
        let mut newcomer = Box::pin(gate.acquire());
        assert!(soon(&mut newcomer).await.is_none());
        assert!(soon(&mut second).await.is_none());
        let first = soon(&mut first).await.expect("first in line");
        drop(first);
        assert!(soon(&mut second).await.is_some());
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_no_hole_in_the_line() {
        let gate = Gate::new(1);
        let held = gate.acquire().await;
        let quitter = gate.acquire();
        let mut next = Box::pin(gate.acquire());
        drop(quitter);
        assert_eq!(gate.waiting(), 1);
        drop(held);
        assert!(soon(&mut next).await.is_some());
    }

    #[tokio::test]
    async fn a_slot_handed_to_a_waiter_that_just_left_goes_on_to_the_next() {
        let gate = Gate::new(1);
        let held = gate.acquire().await;
        let mut quitter = Box::pin(gate.acquire());
        assert!(soon(&mut quitter).await.is_none());
        let mut next = Box::pin(gate.acquire());
        drop(held); // sent to `quitter`, which never polls it
        drop(quitter);
        assert!(soon(&mut next).await.is_some());
    }

    #[tokio::test]
    async fn a_drain_keeps_its_slot_until_a_live_request_waits() {
        let gate = Gate::new(1);
        let mut drain = gate.acquire().await;
        let mut asked = drain.draining();
        assert!(soon(&mut asked).await.is_none(), "nobody waits yet");
        let mut live = Box::pin(gate.acquire());
        assert!(soon(&mut asked).await.is_some(), "asked back");
        assert!(
            soon(&mut live).await.is_none(),
            "not before the drain lets go"
        );
        drop(drain);
        assert!(soon(&mut live).await.is_some());
        assert_eq!(gate.lock().yielding, 0);
    }

    #[tokio::test]
    async fn a_drain_that_starts_while_a_request_waits_yields_at_once() {
        let gate = Gate::new(1);
        let mut reply = gate.acquire().await;
        let mut live = Box::pin(gate.acquire());
        assert!(soon(&mut live).await.is_none());
        assert!(soon(reply.draining()).await.is_some());
        drop(reply);
        assert!(soon(&mut live).await.is_some());
    }

    #[tokio::test]
    async fn one_drain_yields_per_waiter_oldest_first() {
        let gate = Gate::new(2);
        let mut old = gate.acquire().await;
        let mut young = gate.acquire().await;
        let mut old_asked = old.draining();
        let mut young_asked = young.draining();
        let _live = gate.acquire();
        assert!(soon(&mut old_asked).await.is_some());
        assert!(soon(&mut young_asked).await.is_none());
        // A drain that ends by itself lets its slot go as any other.
        drop(young);
        assert_eq!(gate.lock().open, 2, "handed to the waiter");
        drop(old);
        assert_eq!(gate.lock().open, 1);
    }
}
