//! A request's place under a gate, and the handles on it: the slot it
//! holds (`Slot`), the slot it waits for (`Waiter`), either (`Acquire`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::Gate;
use crate::proxy::cut::{Cut, CutWait};

/// A request's place under a gate: the slot it waits for or holds. A
/// session's reply in flight keeps its own (`InFlight`), so that a request
/// that will cut that reply can claim it (`Gate::admit`).
pub struct Place {
    /// Changed only under its gate's lock; a leaf under it.
    state: Mutex<PlaceState>,
}

pub(super) struct PlaceState {
    pub(super) phase: Phase,
    /// A later request that will cut this place's reply counts on its
    /// slot (one promise of the gate's).
    pub(super) claimed_by: Option<Weak<Place>>,
    /// The place this one claimed, while it waits.
    pub(super) claims: Option<Arc<Place>>,
    /// Cut when the slot is asked back from a drain or a background call.
    ask: Option<Arc<Cut>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for a slot.
    Waiting,
    /// Holding a slot, for a live call.
    Holding,
    /// Holding a slot to drain a cut reply, not asked for it.
    Draining,
    /// Holding a slot for a background call, not asked for it.
    Background,
    /// Draining or background, and asked to give the slot up.
    Yielding,
    /// The slot is given up, or the wait for one.
    Gone,
}

impl Place {
    fn new(phase: Phase) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(PlaceState {
                phase,
                claimed_by: None,
                claims: None,
                ask: None,
            }),
        })
    }

    pub(super) fn waiting() -> Arc<Self> {
        Self::new(Phase::Waiting)
    }

    /// A background call's place, waiting; `ask` is cut when its slot is
    /// asked back.
    pub(super) fn background(ask: Arc<Cut>) -> Arc<Self> {
        let place = Self::new(Phase::Waiting);
        place.lock().ask = Some(ask);
        place
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, PlaceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PlaceState {
    pub(super) fn ask(&mut self) -> &Arc<Cut> {
        self.ask.get_or_insert_with(Arc::default)
    }

    /// Tells the drain or background call to give its slot up.
    pub(super) fn ask_back(&mut self) {
        self.phase = Phase::Yielding;
        self.ask().cut();
    }

    pub(super) fn claimed_by_is(&self, by: &Arc<Place>) -> bool {
        matches!(self.phase, Phase::Waiting | Phase::Holding)
            && self
                .claimed_by
                .as_ref()
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(by)))
    }
}

/// One slot, held until dropped.
pub struct Slot {
    gate: Arc<Gate>,
    place: Arc<Place>,
}

impl Slot {
    /// The holder now drains a reply nobody waits for: the slot may be
    /// asked back. The returned future resolves when it is, at once if a
    /// live request already waits, or the request that cut the reply
    /// claimed it.
    pub fn draining(&mut self) -> CutWait {
        self.gate.draining(&self.place)
    }

    pub fn place(&self) -> &Arc<Place> {
        &self.place
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.release(&self.place);
    }
}

/// A slot, at once or once it comes.
pub enum Acquire {
    Ready(Option<Slot>),
    Waiting(Waiter),
}

impl Acquire {
    pub(super) fn ready(gate: &Arc<Gate>) -> Self {
        Self::holding(gate, Place::new(Phase::Holding))
    }

    /// The slot `place` holds already.
    pub(super) fn holding(gate: &Arc<Gate>, place: Arc<Place>) -> Self {
        Acquire::Ready(Some(Slot {
            gate: Arc::clone(gate),
            place,
        }))
    }

    pub(super) fn waiting(
        gate: &Arc<Gate>,
        id: u64,
        place: Arc<Place>,
        rx: oneshot::Receiver<()>,
    ) -> Self {
        Acquire::Waiting(Waiter {
            gate: Arc::clone(gate),
            id,
            place,
            rx: Some(rx),
        })
    }

    /// The request's place: what a later request claims to take its slot.
    pub fn place(&self) -> Option<&Arc<Place>> {
        match self {
            Acquire::Ready(slot) => slot.as_ref().map(Slot::place),
            Acquire::Waiting(w) => Some(&w.place),
        }
    }
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
    place: Arc<Place>,
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
        Poll::Ready(Slot {
            gate: Arc::clone(&self.gate),
            place: Arc::clone(&self.place),
        })
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
            self.gate.release(&self.place);
            return;
        }
        self.gate.leave(self.id);
    }
}
