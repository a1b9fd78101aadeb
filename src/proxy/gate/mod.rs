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
//! recall's own background calls (summary folds, carried notes, fact
//! extraction, embeddings) come last (`background`): a background call
//! gets a slot only while no live request waits for one, after the live
//! waiters, and holds it only while none does. A live request that finds
//! no slot free tells the youngest background call to yield before it
//! tells a drain: a drain records the complete original of what a user
//! heard, a background call is only work to be done again.
//!
//! Slots pass from a holder to the next waiter directly, so that a request
//! arriving meanwhile cannot take a slot out of turn. Which holder is asked
//! to give its slot up is counted apart (`State::promised`): a drain or a
//! background call told to yield, or a claimed place, is a slot coming to
//! some live waiter.

mod place;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::proxy::cut::{Cut, CutWait};

use place::Phase;
pub use place::{Acquire, Place, Slot, Waiter};

pub struct Gate {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Slots held, live, draining or background.
    open: usize,
    /// Live requests waiting for a slot, oldest first.
    waiting: VecDeque<Waiting>,
    /// Background calls waiting for a slot, oldest first: served only
    /// when no live request waits.
    waiting_background: VecDeque<Waiting>,
    next_id: u64,
    /// Drains holding a slot, not yet told to yield, oldest first.
    draining: VecDeque<Arc<Place>>,
    /// Background calls holding a slot, not yet told to yield, oldest
    /// first.
    background: VecDeque<Arc<Place>>,
    /// Slots on their way to a live waiter: drains and background calls
    /// told to yield that still hold their slot, and places claimed by a
    /// request that will cut their reply.
    promised: usize,
}

struct Waiting {
    id: u64,
    tx: oneshot::Sender<()>,
    place: Arc<Place>,
}

impl State {
    /// Tells holders to yield until every live waiter has a slot on its
    /// way.
    fn promise_slots(&mut self) {
        while self.waiting.len() > self.promised {
            if !self.ask_one() {
                return;
            }
        }
    }

    /// Tells one holder to give its slot up for a live waiter: the
    /// youngest background call (the one whose work done so far is
    /// least), else the oldest drain. `false`: none is left to ask.
    fn ask_one(&mut self) -> bool {
        let Some(holder) = self
            .background
            .pop_back()
            .or_else(|| self.draining.pop_front())
        else {
            return false;
        };
        holder.lock().ask_back();
        self.promised += 1;
        true
    }

    fn enqueue(&mut self, place: &Arc<Place>) -> (u64, oneshot::Receiver<()>) {
        let (waiting, rx) = self.waiting_for(place);
        let id = waiting.id;
        self.waiting.push_back(waiting);
        (id, rx)
    }

    fn waiting_for(&mut self, place: &Arc<Place>) -> (Waiting, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let id = self.next_id;
        self.next_id += 1;
        let place = Arc::clone(place);
        (Waiting { id, tx, place }, rx)
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

    /// A background waiter was handed a slot: it holds it until a live
    /// request needs it.
    fn served_background(&mut self, place: &Arc<Place>) {
        place.lock().phase = Phase::Background;
        self.background.push_back(Arc::clone(place));
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
    /// one already on its way to nobody (a holder told to yield for a
    /// waiter that left); else the slot of the youngest background call
    /// or of the oldest drain, told to yield; else the slot of the reply
    /// this request will cut
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
        if st.promised > st.waiting.len() || st.ask_one() {
            // A slot is on its way: already, or from a holder just asked.
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

    /// A slot for a background call: at once if one is free, else once
    /// no live request waits and the background calls that waited before
    /// it have theirs. `ask` is cut when a live request needs the slot
    /// back: the holder must then let go of it (drop the `Slot`) at once.
    /// Dropping the future gives up its place.
    pub fn background(self: &Arc<Self>, ask: Arc<Cut>) -> Acquire {
        let mut st = self.lock();
        let place = Place::background(ask);
        if st.open < self.limit {
            st.open += 1;
            st.served_background(&place);
            return Acquire::holding(self, place);
        }
        let (waiting, rx) = st.waiting_for(&place);
        let id = waiting.id;
        st.waiting_background.push_back(waiting);
        Acquire::waiting(self, id, place, rx)
    }

    /// Live requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Background calls waiting for a slot.
    pub fn waiting_background(&self) -> usize {
        self.lock().waiting_background.len()
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
        let holders = match phase {
            Phase::Draining => Some(&mut st.draining),
            Phase::Background => Some(&mut st.background),
            Phase::Yielding => {
                st.promised = st.promised.saturating_sub(1);
                None
            }
            Phase::Holding if claimed => {
                st.promised = st.promised.saturating_sub(1);
                None
            }
            _ => None,
        };
        if let Some(holders) = holders {
            if let Some(i) = holders.iter().position(|d| Arc::ptr_eq(d, place)) {
                holders.remove(i);
            }
        }
        while let Some(next) = st.waiting.pop_front() {
            if next.tx.send(()).is_ok() {
                st.served(&next.place);
                return;
            }
            st.left(&next.place);
        }
        // No live request waits: the oldest background call that still
        // does.
        while let Some(next) = st.waiting_background.pop_front() {
            if next.tx.send(()).is_ok() {
                st.served_background(&next.place);
                return;
            }
            next.place.lock().phase = Phase::Gone;
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
        } else if let Some(i) = st.waiting_background.iter().position(|w| w.id == id) {
            if let Some(w) = st.waiting_background.remove(i) {
                w.place.lock().phase = Phase::Gone;
            }
        }
    }
}
