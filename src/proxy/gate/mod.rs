//! How many upstream calls recall has open at once, live turns first: an
//! upstream's `max_concurrent` (`acquire`: live requests past the limit
//! wait in order) and `[server] max_concurrent_upstream` (`admit`: a
//! request past the limit waits only for a slot already on its way to it,
//! and is otherwise refused at once).
//!
//! A local model server has few slots (llama.cpp's has one by default).
//! The drain of a cut reply keeps its connection open to record the
//! complete original, and would hold that slot while the user's next turn,
//! the one they are waiting for, queues behind it inside the server. Here a
//! drain holds its slot only while no live request waits: a live request
//! that finds no slot free tells the oldest drain to yield, and takes its
//! slot once the drain has closed its connection.
//!
//! A barge-in cuts the reply in flight of its session, whose slot, once
//! cut, is a drain's. So a request that will cut that reply may claim its
//! place (`admit`'s `cutting`) before it cuts: the reply's drain then
//! yields as soon as it starts, or the reply's slot comes to the request
//! when it ends. The request waits for the slot only after its cut, so it
//! never waits for what its own cut frees, and it is never refused after
//! cutting.
//!
//! Slots pass from a holder to the next waiter directly, so that a request
//! arriving meanwhile cannot take a slot out of turn. Which holder is asked
//! to give its slot up is counted apart (`State::promised`): a drain told
//! to yield, or a claimed place, is a slot coming to some waiter.

mod place;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::proxy::cut::CutWait;

use place::Phase;
pub use place::{Acquire, Place, Slot, Waiter};

pub struct Gate {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Slots held, live or draining.
    open: usize,
    /// Requests waiting for a slot, oldest first.
    waiting: VecDeque<Waiting>,
    next_id: u64,
    /// Drains holding a slot, not yet told to yield, oldest first.
    draining: VecDeque<Arc<Place>>,
    /// Slots on their way to a waiter: drains told to yield that still
    /// hold their slot, and places claimed by a request that will cut
    /// their reply.
    promised: usize,
}

struct Waiting {
    id: u64,
    tx: oneshot::Sender<()>,
    place: Arc<Place>,
}

impl State {
    /// Tells drains to yield until every waiter has a slot on its way.
    fn promise_slots(&mut self) {
        while self.waiting.len() > self.promised {
            let Some(drain) = self.draining.pop_front() else {
                return;
            };
            drain.lock().ask_back();
            self.promised += 1;
        }
    }

    fn enqueue(&mut self, place: &Arc<Place>) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Waiting {
            id,
            tx,
            place: Arc::clone(place),
        });
        (id, rx)
    }

    /// A place that can be claimed for a request that will cut its reply:
    /// `place`, or if it is claimed already, the place of the request that
    /// claimed it (which the new request will cut in turn), and so on.
    fn claimable(place: &Arc<Place>) -> Option<Arc<Place>> {
        let mut place = Arc::clone(place);
        loop {
            let next = {
                let p = place.lock();
                if !matches!(p.phase, Phase::Waiting | Phase::Holding) {
                    return None;
                }
                match &p.claimed_by {
                    None => None,
                    Some(by) => Some(by.upgrade()?),
                }
            };
            match next {
                Some(next) => place = next,
                None => return Some(place),
            }
        }
    }

    /// `by` no longer counts on `claimed`'s slot, if it did and the slot
    /// is not needed for another waiter: promises are counted, not tied
    /// to a waiter, so a slot coming to one may go to another.
    fn unclaim(&mut self, claimed: &Arc<Place>, by: &Arc<Place>) {
        let mut c = claimed.lock();
        if c.claimed_by_is(by) && self.promised > self.waiting.len() {
            c.claimed_by = None;
            self.promised -= 1;
        }
    }

    /// A waiter was handed a slot: what it had claimed goes on to
    /// another waiter, or is let go.
    fn served(&mut self, place: &Arc<Place>) {
        let claims = {
            let mut p = place.lock();
            p.phase = Phase::Holding;
            p.claims.take()
        };
        if let Some(claims) = claims {
            self.unclaim(&claims, place);
        }
    }

    /// A waiter left without a slot. If a later request claimed its place
    /// (and will cut it), that request now counts on what this one had
    /// claimed.
    fn left(&mut self, place: &Arc<Place>) {
        let (claimed_by, claims) = {
            let mut p = place.lock();
            p.phase = Phase::Gone;
            (p.claimed_by.take(), p.claims.take())
        };
        if claimed_by.is_some() {
            self.promised = self.promised.saturating_sub(1);
        }
        if let Some(claims) = claims {
            match claimed_by.and_then(|by| by.upgrade()) {
                Some(by) => {
                    let mut c = claims.lock();
                    if c.claimed_by_is(place) {
                        c.claimed_by = Some(Arc::downgrade(&by));
                        drop(c);
                        by.lock().claims = Some(claims);
                    }
                }
                None => self.unclaim(&claims, place),
            }
        }
        // A waiter that counted on this place may take a drain's slot.
        self.promise_slots();
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
            return Acquire::ready(self);
        }
        let place = Place::waiting();
        let (id, rx) = st.enqueue(&place);
        st.promise_slots();
        Acquire::waiting(self, id, place, rx)
    }

    /// A slot for a live request that does not queue: a free one; else
    /// one already on its way to nobody (a drain told to yield for a
    /// waiter that left); else the slot of the oldest drain, told to
    /// yield; else the slot of the reply this request will cut
    /// (`cutting`: its session's reply in flight, claimed here, before
    /// the cut). `None`: no slot can come, and the request is refused.
    /// The returned future must be awaited only once the request has cut
    /// what it claimed.
    pub fn admit(self: &Arc<Self>, cutting: Option<&Arc<Place>>) -> Option<Acquire> {
        let mut st = self.lock();
        if st.open < self.limit {
            st.open += 1;
            return Some(Acquire::ready(self));
        }
        let place = Place::waiting();
        if st.promised > st.waiting.len() {
            // Nothing to ask: a slot is already on its way.
        } else if let Some(drain) = st.draining.pop_front() {
            drain.lock().ask_back();
            st.promised += 1;
        } else if let Some(claimed) = cutting.and_then(State::claimable) {
            claimed.lock().claimed_by = Some(Arc::downgrade(&place));
            place.lock().claims = Some(claimed);
            st.promised += 1;
        } else {
            return None;
        }
        let (id, rx) = st.enqueue(&place);
        Some(Acquire::waiting(self, id, place, rx))
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The holder of `place`'s slot now drains a reply nobody waits for:
    /// the slot may be asked back. The returned future resolves when it
    /// is, at once if its place was claimed or a live request waits.
    fn draining(&self, place: &Arc<Place>) -> CutWait {
        let mut st = self.lock();
        let mut p = place.lock();
        let wait = p.ask().wait();
        if p.phase != Phase::Holding {
            return wait;
        }
        if p.claimed_by.take().is_some() {
            // Claimed by the request that cut its reply: the slot promised
            // to that request comes from this drain's yield.
            p.ask_back();
            return wait;
        }
        p.phase = Phase::Draining;
        drop(p);
        st.draining.push_back(Arc::clone(place));
        st.promise_slots();
        wait
    }

    /// A slot's holder is done with it: it goes to the oldest waiter still
    /// there, or back to the free ones.
    fn release(&self, place: &Arc<Place>) {
        let mut st = self.lock();
        let (phase, claimed) = {
            let mut p = place.lock();
            let phase = std::mem::replace(&mut p.phase, Phase::Gone);
            (phase, p.claimed_by.take().is_some())
        };
        match phase {
            Phase::Draining => {
                if let Some(i) = st.draining.iter().position(|d| Arc::ptr_eq(d, place)) {
                    st.draining.remove(i);
                }
            }
            Phase::Yielding => st.promised = st.promised.saturating_sub(1),
            Phase::Holding if claimed => st.promised = st.promised.saturating_sub(1),
            _ => {}
        }
        while let Some(next) = st.waiting.pop_front() {
            if next.tx.send(()).is_ok() {
                st.served(&next.place);
                return;
            }
            st.left(&next.place);
        }
        st.open = st.open.saturating_sub(1);
    }

    /// A waiter gave up its place before it was handed a slot.
    fn leave(&self, id: u64) {
        let mut st = self.lock();
        if let Some(i) = st.waiting.iter().position(|w| w.id == id) {
            if let Some(w) = st.waiting.remove(i) {
                st.left(&w.place);
            }
        }
    }
}
