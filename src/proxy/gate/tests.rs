//! The gate as a request sees it: queued (`acquire`) and refused or
//! promised (`admit`), with drains and claims; and background calls
//! (`background`), behind them all.

use super::*;
use place::Phase;
use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;

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
    assert_eq!(gate.lock().promised, 0);
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

/// Open slots, waiters and slots on their way: all zero once every
/// holder and waiter is gone.
fn counts(gate: &Gate) -> (usize, usize, usize) {
    let st = gate.lock();
    (st.open, st.waiting.len(), st.promised)
}

fn held(acquire: Option<Acquire>) -> Slot {
    acquire
        .expect("admitted")
        .now_or_never()
        .expect("a free slot")
}

#[tokio::test]
async fn admit_takes_a_free_slot_and_refuses_at_once_when_none_can_come() {
    let gate = Gate::new(1);
    let live = held(gate.admit(None));
    assert!(gate.admit(None).is_none());
    // Its own place is not one it will cut.
    assert!(gate.admit(None).is_none());
    assert_eq!(counts(&gate), (1, 0, 0));
    drop(live);
    let _again = held(gate.admit(None));
}

#[tokio::test]
async fn admit_takes_the_slot_of_the_oldest_drain_and_waits_only_for_it() {
    let gate = Gate::new(2);
    let mut old = held(gate.admit(None));
    let mut young = held(gate.admit(None));
    let mut old_asked = old.draining();
    let mut young_asked = young.draining();
    assert!(soon(&mut old_asked).await.is_none(), "nobody waits yet");
    let mut first = Box::pin(gate.admit(None).expect("a drain yields"));
    assert!(soon(&mut old_asked).await.is_some());
    assert!(soon(&mut young_asked).await.is_none());
    let mut second = Box::pin(gate.admit(None).expect("the other drain yields"));
    assert!(soon(&mut young_asked).await.is_some());
    assert!(gate.admit(None).is_none(), "no drain left to ask");
    assert!(
        soon(&mut first).await.is_none(),
        "not before a drain lets go"
    );
    drop(young);
    let first = soon(&mut first).await.expect("the first slot let go");
    drop(old);
    let second = soon(&mut second).await.expect("and the next");
    drop((first, second));
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_slot_already_on_its_way_to_nobody_goes_to_the_next_request() {
    let gate = Gate::new(1);
    let mut drain = held(gate.admit(None));
    let mut asked = drain.draining();
    let quitter = gate.admit(None).expect("the drain yields");
    assert!(soon(&mut asked).await.is_some());
    drop(quitter);
    // The drain was asked and is letting go: nothing more to ask.
    let mut next = Box::pin(gate.admit(None).expect("the slot on its way"));
    drop(drain);
    let next = soon(&mut next).await.expect("handed over");
    drop(next);
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_barge_in_claims_the_slot_of_the_reply_it_will_cut() {
    let gate = Gate::new(1);
    let mut reply = held(gate.admit(None));
    let mut barge_in = Box::pin(gate.admit(Some(reply.place())).expect("claimed"));
    // It waits only after its cut; the cut reply's drain yields at once.
    assert!(soon(&mut barge_in).await.is_none());
    assert!(soon(reply.draining()).await.is_some());
    drop(reply);
    let slot = soon(&mut barge_in).await.expect("the cut reply's slot");
    assert_eq!(counts(&gate), (1, 0, 0));
    drop(slot);
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_claimed_reply_that_ends_by_itself_hands_its_slot_over() {
    let gate = Gate::new(1);
    let reply = held(gate.admit(None));
    let mut barge_in = Box::pin(gate.admit(Some(reply.place())).expect("claimed"));
    drop(reply);
    assert!(soon(&mut barge_in).await.is_some());
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_barge_in_that_gives_up_leaves_the_reply_its_drain() {
    let gate = Gate::new(1);
    let mut reply = held(gate.admit(None));
    let refused = gate.admit(Some(reply.place())).expect("claimed");
    drop(refused); // say, a 409 or a storage error before the cut
    assert_eq!(counts(&gate), (1, 0, 0));
    let mut asked = reply.draining();
    assert!(soon(&mut asked).await.is_none(), "nobody waits");
    // A later request asks the drain as any other.
    let _next = gate.admit(None).expect("the drain yields");
    assert!(soon(&mut asked).await.is_some());
}

#[tokio::test]
async fn a_claim_on_a_place_already_claimed_goes_to_its_claimer() {
    // Two barge-ins on one reply: each cuts the turn before it. B cuts A,
    // then C cuts B, which leaves before its slot came.
    let gate = Gate::new(1);
    let mut a = held(gate.admit(None));
    let b = gate.admit(Some(a.place())).expect("B claims A");
    let mut c = Box::pin(gate.admit(Some(a.place())).expect("C claims B"));
    assert_eq!(counts(&gate), (1, 2, 2));
    assert!(soon(a.draining()).await.is_some());
    drop(b);
    assert_eq!(counts(&gate), (1, 1, 1));
    drop(a);
    assert!(soon(&mut c).await.is_some());
    assert_eq!(counts(&gate), (0, 0, 0));

    // The other order: C cuts A, then B cuts C.
    let mut a = held(gate.admit(None));
    let mut b = Box::pin(gate.admit(Some(a.place())).expect("B claims A"));
    let c = gate.admit(Some(a.place())).expect("C claims B");
    assert!(soon(a.draining()).await.is_some());
    drop(c);
    assert_eq!(counts(&gate), (1, 1, 1));
    drop(a);
    assert!(soon(&mut b).await.is_some());
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_barge_in_served_by_another_slot_gives_its_claim_back() {
    let gate = Gate::new(2);
    let other = held(gate.admit(None));
    let mut reply = held(gate.admit(None));
    let mut barge_in = Box::pin(gate.admit(Some(reply.place())).expect("claimed"));
    drop(other);
    let _slot = soon(&mut barge_in).await.expect("the free slot");
    assert_eq!(counts(&gate), (2, 0, 0));
    // The reply it claimed drains on with its slot: nobody waits.
    assert!(soon(reply.draining()).await.is_none());
}

#[tokio::test]
async fn a_drain_asked_by_one_gate_lets_go_of_the_other_gates_slot_too() {
    let outer = Gate::new(1);
    let inner = Gate::new(1);
    let mut a = (held(outer.admit(None)), inner.acquire().await);
    let asked = (a.0.draining(), a.1.draining());
    let mut live = Box::pin(inner.acquire());
    let mut asked = Box::pin(futures_util::future::select(asked.0, asked.1));
    assert!(soon(&mut asked).await.is_some(), "asked by the inner gate");
    drop(a);
    assert!(soon(&mut live).await.is_some());
    // The outer gate's drain was never asked: its slot is simply free.
    assert_eq!(counts(&outer), (0, 0, 0));
    assert_eq!(counts(&inner).2, 0);
}

/// A background call's wait for a slot, and the ask it hears when a live
/// request needs the slot back.
fn background(gate: &Arc<Gate>) -> (Acquire, Arc<Cut>) {
    let ask = Arc::new(Cut::default());
    (gate.background(Arc::clone(&ask)), ask)
}

#[tokio::test]
async fn a_background_call_waits_behind_live_requests_even_those_that_came_later() {
    let gate = Gate::new(1);
    let held = gate.acquire().await;
    let (mut bg, _) = background(&gate);
    let mut live = Box::pin(gate.acquire());
    assert!(soon(&mut bg).await.is_none());
    assert!(soon(&mut live).await.is_none());
    assert_eq!((gate.waiting(), gate.waiting_background()), (1, 1));
    drop(held);
    let live = soon(&mut live).await.expect("the live request first");
    assert!(
        soon(&mut bg).await.is_none(),
        "not while a live one holds it"
    );
    drop(live);
    let bg = soon(&mut bg).await.expect("then the background call");
    drop(bg);
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_live_request_makes_a_background_holder_yield_and_takes_its_slot() {
    let gate = Gate::new(1);
    let (bg, ask) = background(&gate);
    let bg = soon(bg).await.expect("a free slot");
    assert!(!ask.is_cut(), "nobody waits");
    let mut live = Box::pin(gate.acquire());
    assert!(ask.is_cut(), "asked back");
    assert_eq!(counts(&gate), (1, 1, 1));
    assert!(
        soon(&mut live).await.is_none(),
        "not before the background call lets go"
    );
    drop(bg);
    let live = soon(&mut live).await.expect("its slot");
    assert_eq!(counts(&gate), (1, 0, 0));
    // Made again, the background call waits for the live one to end.
    let (mut again, ask) = background(&gate);
    assert!(soon(&mut again).await.is_none());
    drop(live);
    let again = soon(&mut again).await.expect("the slot");
    assert!(!ask.is_cut());
    drop(again);
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn one_background_call_yields_per_live_waiter_the_youngest_first() {
    let gate = Gate::new(2);
    let (old, old_ask) = background(&gate);
    let (young, young_ask) = background(&gate);
    let (old, young) = (old.await, young.await);
    let _first = gate.acquire();
    assert!(young_ask.is_cut() && !old_ask.is_cut());
    let _second = gate.acquire();
    assert!(old_ask.is_cut());
    drop((old, young));
    assert_eq!(counts(&gate), (2, 0, 0), "both handed to the live waiters");
}

#[tokio::test]
async fn a_background_waiter_is_served_when_the_live_waiters_are_gone() {
    let gate = Gate::new(1);
    let held = gate.acquire().await;
    let live = gate.acquire();
    let (mut bg, _) = background(&gate);
    assert!(soon(&mut bg).await.is_none());
    drop(live);
    assert!(soon(&mut bg).await.is_none(), "the slot is still held");
    drop(held);
    let bg = soon(&mut bg).await.expect("no live request waits");
    drop(bg);
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn a_background_waiter_that_gives_up_leaves_no_hole_in_the_line() {
    let gate = Gate::new(1);
    let held = gate.acquire().await;
    let (quitter, _) = background(&gate);
    let (mut handed, _) = background(&gate);
    let (mut next, _) = background(&gate);
    drop(quitter);
    assert_eq!(gate.waiting_background(), 2);
    assert!(soon(&mut handed).await.is_none());
    drop(held); // sent to `handed`, which never takes it
    drop(handed);
    let next = soon(&mut next).await.expect("passed on");
    drop(next);
    assert_eq!(counts(&gate), (0, 0, 0));
    assert_eq!(gate.waiting_background(), 0);
    assert!(gate.lock().background.is_empty());
}

#[tokio::test]
async fn background_calls_yield_before_drains_and_never_make_a_drain_yield() {
    let gate = Gate::new(2);
    let mut drain = gate.acquire().await;
    let mut drain_asked = drain.draining();
    let (bg, bg_ask) = background(&gate);
    let bg = bg.await;
    // A background waiter asks nobody: it waits behind the drain.
    let (mut waiter, _) = background(&gate);
    assert!(soon(&mut drain_asked).await.is_none());
    assert!(!bg_ask.is_cut());
    // A live waiter takes the background call's slot, not the drain's.
    let mut live = Box::pin(gate.acquire());
    assert!(bg_ask.is_cut());
    assert!(soon(&mut drain_asked).await.is_none());
    drop(bg);
    let live = soon(&mut live).await.expect("the background call's slot");
    // A second live waiter, with no background call left, asks the drain.
    let mut second = Box::pin(gate.acquire());
    assert!(soon(&mut drain_asked).await.is_some());
    drop(drain);
    let second = soon(&mut second).await.expect("the drain's slot");
    assert!(soon(&mut waiter).await.is_none(), "both held by live ones");
    drop((live, second));
    let waiter = soon(&mut waiter).await.expect("at last");
    drop(waiter);
    assert_eq!(counts(&gate), (0, 0, 0));
}

#[tokio::test]
async fn admit_takes_the_slot_of_a_background_call_before_a_drains() {
    let gate = Gate::new(2);
    let mut drain = held(gate.admit(None));
    let mut drain_asked = drain.draining();
    let (bg, bg_ask) = background(&gate);
    let bg = bg.await;
    let mut first = Box::pin(gate.admit(None).expect("the background call yields"));
    assert!(bg_ask.is_cut());
    assert!(soon(&mut drain_asked).await.is_none());
    let mut second = Box::pin(gate.admit(None).expect("then the drain"));
    assert!(soon(&mut drain_asked).await.is_some());
    assert!(gate.admit(None).is_none(), "nothing left to ask");
    drop((bg, drain));
    let slots = (soon(&mut first).await, soon(&mut second).await);
    assert!(slots.0.is_some() && slots.1.is_some());
    drop(slots);
    assert_eq!(counts(&gate), (0, 0, 0));
}

/// A small deterministic random walk over admits, claims, drains, live
/// and background waits, and drops: the counts always hold, a background
/// call never gets a slot a live request waits for, and with every holder
/// gone every waiter gets a slot.
#[test]
fn any_order_of_admits_claims_drains_and_drops_keeps_the_counts() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rand = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let (mut claims, mut yields, mut served_background) = (0, 0, 0);
    for _ in 0..500 {
        let limit = 1 + rand(3);
        let gate = Gate::new(limit);
        let mut slots: Vec<Slot> = Vec::new();
        // Each with whether it is a background call's.
        let mut waiters: Vec<(Acquire, bool)> = Vec::new();
        let mut asks = Vec::new();
        let mut background_asks: Vec<Arc<Cut>> = Vec::new();
        for _ in 0..60 {
            match rand(8) {
                0 | 1 => {
                    let live: Vec<&Acquire> =
                        waiters.iter().filter(|w| !w.1).map(|w| &w.0).collect();
                    // Only a live request's place is ever cut, so claimed
                    // (a background holder's is not claimable).
                    let claim = match rand(3) {
                        0 if !slots.is_empty() => {
                            Some(Arc::clone(slots[rand(slots.len())].place()))
                        }
                        1 if !live.is_empty() => live[rand(live.len())].place().cloned(),
                        _ => None,
                    };
                    if let Some(a) = gate.admit(claim.as_ref()) {
                        waiters.push((a, false));
                    }
                }
                2 if !slots.is_empty() => {
                    let i = rand(slots.len());
                    asks.push(slots[i].draining());
                }
                3 if !slots.is_empty() => drop(slots.swap_remove(rand(slots.len()))),
                4 if !waiters.is_empty() => drop(waiters.swap_remove(rand(waiters.len()))),
                5 => waiters.push((gate.acquire(), false)),
                6 => {
                    let ask = Arc::new(Cut::default());
                    waiters.push((gate.background(Arc::clone(&ask)), true));
                    background_asks.push(ask);
                }
                _ => {}
            }
            // Waiters that were handed a slot take it.
            let mut still = Vec::new();
            let mut background_now = false;
            for (mut w, bg) in waiters.drain(..) {
                match (&mut w).now_or_never() {
                    Some(slot) => {
                        background_now |= bg;
                        slots.push(slot);
                    }
                    None => still.push((w, bg)),
                }
            }
            waiters = still;
            let (open, waiting, promised) = counts(&gate);
            let st = gate.lock();
            assert!(open <= limit);
            assert!(
                (waiting == 0 && st.waiting_background.is_empty()) || open == limit,
                "a waiter beside a free slot"
            );
            assert!(
                !background_now || waiting == 0,
                "a background call served while a live request waits"
            );
            assert!(
                waiting <= promised || (st.draining.is_empty() && st.background.is_empty()),
                "a live waiter without a slot on its way beside a holder not asked"
            );
            served_background += usize::from(background_now);
            claims += usize::from(st.waiting.iter().any(|w| w.place.lock().claims.is_some()));
            drop(st);
            let places = slots
                .iter()
                .map(Slot::place)
                .chain(waiters.iter().filter_map(|w| w.0.place()));
            let on_their_way: usize = places
                .map(|p| {
                    let p = p.lock();
                    let claimed = p.claimed_by.is_some()
                        && matches!(p.phase, Phase::Waiting | Phase::Holding);
                    usize::from(p.phase == Phase::Yielding) + usize::from(claimed)
                })
                .sum();
            assert_eq!(promised, on_their_way, "promises miscounted");
        }
        yields += background_asks.iter().filter(|a| a.is_cut()).count();
        // Every holder lets go: each waiter left gets a slot in turn.
        while !slots.is_empty() || !waiters.is_empty() {
            slots.clear();
            let before = waiters.len();
            let mut still = Vec::new();
            for (mut w, bg) in waiters.drain(..) {
                match (&mut w).now_or_never() {
                    Some(slot) => slots.push(slot),
                    None => still.push((w, bg)),
                }
            }
            waiters = still;
            assert!(
                waiters.is_empty() || waiters.len() < before,
                "a waiter starved"
            );
        }
        assert_eq!(counts(&gate), (0, 0, 0));
        let st = gate.lock();
        assert!(st.draining.is_empty() && st.background.is_empty());
        assert!(st.waiting_background.is_empty());
    }
    assert!(claims > 100, "the walk hardly claimed: {claims}");
    assert!(yields > 100, "background calls hardly yielded: {yields}");
    assert!(
        served_background > 100,
        "background calls hardly served: {served_background}"
    );
}
