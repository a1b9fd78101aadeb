//! A session's reloads and the versions its writes expect, on a real
//! SQLite store (memory storage writes nothing, so nothing would move).

use std::sync::Arc;

use super::state::State;
use super::{Policy, Store};
use crate::clock::Clock;
use crate::config::{HistoryConfig, OnNewRequest, StorageBackend, StorageConfig};
use crate::memory::message::{Message, Role};
use crate::metrics::Metrics;
use crate::store::{Loaded, Meta, Op, Storage};
use crate::webhook::LogOnly;

async fn policy(name: &str) -> Policy {
    // A fixed place, emptied first, as the store's own unit tests do: a
    // directory per process was left behind by every run.
    let dir = std::env::temp_dir().join("recall-session-unit").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = StorageConfig {
        backend: StorageBackend::Sqlite,
        path: dir.join("s.db").to_string_lossy().into_owned(),
        ..StorageConfig::default()
    };
    let metrics = Arc::new(Metrics::default());
    Policy {
        history: HistoryConfig::default(),
        memory: Default::default(),
        long_term: Default::default(),
        on_new_request: OnNewRequest::Interrupt,
        barge_in_after_close_ms: 0,
        storage: Storage::open(&config, &metrics).await.unwrap(),
        metrics,
        notifier: Arc::new(LogOnly),
        clock: Clock::manual(1),
    }
}

fn texts(s: &super::Session) -> Vec<String> {
    s.snapshot()
        .messages
        .iter()
        .map(|m| m.content.as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A reload races the session's own writes: storage read before a write
/// of this session's landed is older than memory and must not replace it
/// (`Store::find` reads again); a read after it is taken.
#[tokio::test]
async fn a_reload_older_than_a_write_of_its_own_is_refused() {
    let policy = policy("reload").await;
    let (s, _) = Store::default().get_or_create("r", 1);
    let say = |text: &str| {
        s.append_messages(&policy, vec![Message::new(Role::User, text)], 2)
            .unwrap()
            .1
    };
    say("one").durable().await.unwrap();

    let before = s.batches();
    let read = policy.storage.load("r").await.unwrap().unwrap();
    say("two").durable().await.unwrap();
    assert!(!s.reload(read, before), "an older read replaced memory");
    assert_eq!(texts(&s), ["one", "two"]);

    let before = s.batches();
    let read = policy.storage.load("r").await.unwrap().unwrap();
    assert_eq!(read.messages.len(), 2);
    assert!(s.reload(read, before));
    assert_eq!(texts(&s), ["one", "two"]);
    // Reloaded memory writes on: the next message follows the stored two.
    say("three").durable().await.unwrap();
    let stored = policy.storage.load("r").await.unwrap().unwrap();
    assert_eq!(stored.messages.len(), 3);
}

/// Each batch that changes data expects the version before it: the one
/// the session was read at, then one more per such batch; a write that
/// changes no data (a reload's `Resume`) moves nothing; a reload starts
/// over from what it read.
#[tokio::test]
async fn a_sessions_writes_count_from_the_version_it_was_read_at() {
    let policy = policy("versions").await;
    let loaded = |version| Loaded {
        meta: Meta::default(),
        messages: vec![Message::new(Role::User, "hi")],
        version,
    };
    let s = super::Session::from_loaded("v", loaded(7));
    let version = || s.state().saved.version;
    assert_eq!(version(), 7);
    for expect in [8, 9] {
        let (_, ticket) = s
            .append_messages(&policy, vec![Message::new(Role::User, "more")], 2)
            .unwrap();
        ticket.durable().await.unwrap();
        assert_eq!(version(), expect);
    }
    assert!(s.recover(Some(loaded(3)), s.batches(), &policy.storage));
    assert_eq!(version(), 3, "a reload expects what it read");
    assert_eq!(
        State::new(Meta::default()).saved.version,
        0,
        "a new session expects none stored"
    );
}

/// A session this replica started, replaced by what storage holds (a
/// session another replica started under the same id meanwhile), writes
/// as that session: its creation time, not its own, or every write would
/// be refused as meant for another session.
#[tokio::test]
async fn a_reload_takes_the_stored_sessions_creation_time() {
    let policy = policy("born").await;
    let (s, _) = Store::default().get_or_create("b", 100);
    let mut read = Loaded {
        meta: Meta::default(),
        messages: Vec::new(),
        version: 4,
    };
    read.meta.created_ms = 5;
    assert!(s.recover(Some(read), s.batches(), &policy.storage));
    let st = s.state();
    match s.expect(&st) {
        Op::Expect {
            version,
            created_ms,
            ..
        } => assert_eq!((version, created_ms), (4, 5)),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.meta(&st).created_ms, 5, "a Save would rewrite its birth");
}

/// A fold's answer is stored only in the conversation it was taken from,
/// as long as the summary it extends holds; a reload keeps the fold under
/// way and an answer waiting for a turn.
#[tokio::test]
async fn a_folds_answer_lands_only_where_it_still_holds() {
    use super::remember::{Applied, FoldNow};
    use crate::memory::summary::Folded;
    let policy = policy("folds").await;
    let config = crate::Config::parse(
        "[[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:1/v1\"\n",
        std::path::Path::new("t.toml"),
    )
    .unwrap();
    let rules = crate::proxy::protocol::VendorRules::from_config(&config.upstreams[0]);
    let limits = crate::memory::window::Limits {
        messages: 2,
        ..Default::default()
    };
    let turns: Vec<Message> = (0..4)
        .flat_map(|i| {
            [
                Message::new(Role::User, format!("q{i}")),
                Message::new(Role::Assistant, format!("r{i}")),
            ]
        })
        .collect();
    let start = |s: &super::Session| match s.fold_now(&rules, limits).unwrap() {
        FoldNow::Start(fold) => fold,
        other => panic!("{other:?}"),
    };
    let answer = |fold: &crate::memory::summary::Fold| Folded {
        fold: fold.clone(),
        text: "summary".into(),
        model: "m".into(),
        covered_tokens: 4,
        at_ms: 3,
    };

    // An answer for an earlier session of the same id does not land.
    let (old, _) = Store::default().get_or_create("f", 10);
    old.append_messages(&policy, turns.clone(), 11).unwrap();
    let fold = start(&old);
    assert_eq!((fold.from, fold.until), (0, 6));
    assert!(matches!(old.fold_now(&rules, limits), Ok(FoldNow::Running)));
    // (Its own database: the two would write over each other's here.)
    let elsewhere = self::policy("folds-new").await;
    let (new, _) = Store::default().get_or_create("f", 20);
    new.append_messages(&elsewhere, turns[..2].to_vec(), 21)
        .unwrap();
    let (applied, _) = new.offer_fold(&elsewhere, answer(&fold), false).unwrap();
    assert_eq!(applied, Applied::Stale);

    // In its own session it lands, once.
    let (applied, ticket) = old.offer_fold(&policy, answer(&fold), false).unwrap();
    ticket.durable().await.unwrap();
    assert!(
        matches!(applied, Applied::Stored(ref s) if s.until == 6),
        "{applied:?}"
    );
    let (again, _) = old.offer_fold(&policy, answer(&fold), false).unwrap();
    assert_eq!(again, Applied::Stale, "the summary it extended is gone");

    // Needing a turn's lease and finding none, it waits for the next turn;
    // a reload keeps it, and the fold under way.
    old.fold_ended(None);
    old.append_messages(&policy, turns.clone(), 12).unwrap();
    let fold = start(&old);
    let (applied, _) = old.offer_fold(&policy, answer(&fold), true).unwrap();
    assert_eq!(applied, Applied::Pending);
    let read = policy.storage.load("f").await.unwrap().unwrap();
    assert!(old.reload(read, old.batches()));
    assert!(old.has_pending());
    assert!(matches!(old.fold_now(&rules, limits), Ok(FoldNow::Running)));
    let (stored, _) = old.store_pending(&policy).unwrap().unwrap();
    assert!(
        matches!(stored, Applied::Stored(ref s) if s.until == 14),
        "{stored:?}"
    );
    assert!(!old.has_pending());
}
