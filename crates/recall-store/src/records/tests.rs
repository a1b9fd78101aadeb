//! `Records` on every backend: memory always, SQLite on a temporary file,
//! Redis when `RECALL_TEST_REDIS_URL` names one. Each test has user keys
//! (and a Redis key prefix) of its own, since tests share one Redis.

use std::sync::Arc;

use super::stored::{body, from_blob, to_blob};
use super::*;
use crate::tests::Unmeasured;
use recall_core::config::{StorageBackend, StorageConfig};

/// A database file removed, with its WAL, when dropped.
struct TempDb(String);

impl TempDb {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join("recall-records-unit");
        std::fs::create_dir_all(&dir).unwrap();
        let db = Self(format!(
            "{}/{name}-{}.db",
            dir.display(),
            std::process::id()
        ));
        db.remove();
        db
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0));
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}

/// One backend under test.
struct Backend {
    name: &'static str,
    storage: Arc<Storage>,
    config: StorageConfig,
    _db: Option<TempDb>,
}

fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{test}-{}-{nanos}", std::process::id())
}

fn redis_config(test: &str) -> Option<StorageConfig> {
    let url = std::env::var("RECALL_TEST_REDIS_URL").ok()?;
    Some(StorageConfig {
        backend: StorageBackend::Redis,
        url: Some(url),
        key_prefix: format!("rec-{}", unique(test)),
        ..StorageConfig::default()
    })
}

async fn sqlite(test: &str) -> Backend {
    let db = TempDb::new(test);
    let config = StorageConfig {
        backend: StorageBackend::Sqlite,
        path: db.0.clone(),
        ..StorageConfig::default()
    };
    Backend {
        name: "sqlite",
        storage: Storage::open(&config, &Unmeasured).await.unwrap(),
        config,
        _db: Some(db),
    }
}

async fn backends(test: &str) -> Vec<Backend> {
    let mut out = vec![
        Backend {
            name: "memory",
            storage: Arc::new(Storage::Memory),
            config: StorageConfig::default(),
            _db: None,
        },
        sqlite(test).await,
    ];
    if let Some(config) = redis_config(test) {
        out.push(Backend {
            name: "redis",
            storage: Storage::open(&config, &Unmeasured).await.unwrap(),
            config,
            _db: None,
        });
    }
    out
}

fn rec(id: &str, text: &str, embedding: Vec<f32>) -> Record {
    Record {
        id: id.into(),
        text: text.into(),
        strategy: "facts".into(),
        namespace: "/facts/ada".into(),
        user: "ada".into(),
        session: "s1".into(),
        created_at: 1_700_000_000_123,
        updated_at: 1_700_000_000_456,
        recalled_at: 0,
        said_at: None,
        superseded_by: None,
        valid_to: None,
        embedding: embedding.into(),
        terms: Default::default(),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn ids(held: &Held) -> Vec<&str> {
    held.records.iter().map(|r| r.id.as_str()).collect()
}

#[tokio::test]
async fn records_come_back_as_put_with_their_embeddings_exact() {
    let odd = vec![
        0.1,
        -0.0,
        f32::MIN_POSITIVE,
        f32::MAX,
        1e-45,
        -3.75,
        f32::NAN,
    ];
    for b in backends("round-trip").await {
        let (s, records) = (&*b.storage, Records::default());
        let user = unique("round-trip");
        let empty = records.of(s, &user).await.unwrap();
        assert_eq!(*empty, Held::default(), "{}", b.name);
        let put = vec![
            rec("b", "likes tea", odd.clone()),
            rec("a", "é \"q\"", vec![]),
        ];
        assert!(records.change(s, &user, 0, put, vec![]).await.unwrap());
        let mut readers = vec![records];
        if b.storage.persistent() {
            // Read back from storage, not from the writer's cache.
            readers.push(Records::default());
        }
        for r in &readers {
            let held = r.of(s, &user).await.unwrap();
            assert_eq!(held.version, 1, "{}", b.name);
            assert_eq!(ids(&held), ["a", "b"], "{}", b.name);
            assert_eq!(held.records[0].text, "é \"q\"", "{}", b.name);
            assert!(held.records[0].embedding.is_empty(), "{}", b.name);
            assert_eq!(bits(&held.records[1].embedding), bits(&odd), "{}", b.name);
            let mut fields = Record::clone(&held.records[1]);
            fields.embedding = Vec::new().into();
            assert_eq!(fields, rec("b", "likes tea", vec![]), "{}", b.name);
        }
    }
}

#[tokio::test]
async fn a_change_at_a_stale_version_writes_nothing() {
    for b in backends("stale").await {
        let (s, records) = (&*b.storage, Records::default());
        let user = unique("stale");
        let put = vec![rec("a", "one", vec![1.0])];
        assert!(records.change(s, &user, 0, put, vec![]).await.unwrap());
        let put = vec![rec("b", "two", vec![2.0])];
        let stale = records.change(s, &user, 0, put, vec!["a".into()]);
        assert!(!stale.await.unwrap(), "{}", b.name);
        let mut readers = vec![records];
        if b.storage.persistent() {
            readers.push(Records::default());
        }
        for r in &readers {
            let held = r.of(s, &user).await.unwrap();
            assert_eq!((held.version, ids(&held)), (1, vec!["a"]), "{}", b.name);
        }
        // Removal and replacement, at the version read.
        let put = vec![rec("b", "two", vec![2.0]), rec("c", "three", vec![3.0])];
        let remove = vec!["a".into(), "c".into()];
        assert!(readers[0].change(s, &user, 1, put, remove).await.unwrap());
        let put = vec![rec("b", "two, again", vec![2.5])];
        assert!(readers[0].change(s, &user, 2, put, vec![]).await.unwrap());
        // (A second cache over one SQLite would be stale by now: one per
        // process.)
        readers.truncate(1);
        if b.storage.persistent() {
            readers.push(Records::default());
        }
        for r in &readers {
            let held = r.of(s, &user).await.unwrap();
            assert_eq!(
                (held.version, ids(&held)),
                (3, vec!["b", "c"]),
                "{}",
                b.name
            );
            assert_eq!(held.records[0].text, "two, again", "{}", b.name);
            assert_eq!(*held.records[0].embedding, [2.5], "{}", b.name);
        }
    }
}

#[tokio::test]
async fn of_two_changes_at_one_version_exactly_one_is_made() {
    for b in backends("race").await {
        let records = Arc::new(Records::default());
        let user = unique("race");
        for round in 0..10u64 {
            let tasks: Vec<_> = (0..2)
                .map(|i| {
                    let (records, s, user) =
                        (Arc::clone(&records), Arc::clone(&b.storage), user.clone());
                    tokio::spawn(async move {
                        let id = format!("r{round}-{i}");
                        let put = vec![rec(&id, "x", vec![i as f32])];
                        records.change(&s, &user, round, put, vec![]).await.unwrap()
                    })
                })
                .collect();
            let mut won = 0;
            for t in tasks {
                won += usize::from(t.await.unwrap());
            }
            assert_eq!(won, 1, "{} round {round}", b.name);
        }
        let held = records.of(&b.storage, &user).await.unwrap();
        assert_eq!((held.version, held.records.len()), (10, 10), "{}", b.name);
    }
}

#[tokio::test]
async fn a_delete_removes_one_record_and_says_whether_it_was_there() {
    for b in backends("delete").await {
        let (s, records) = (&*b.storage, Records::default());
        let user = unique("delete");
        let put = vec![rec("a", "one", vec![1.0]), rec("b", "two", vec![2.0])];
        assert!(records.change(s, &user, 0, put, vec![]).await.unwrap());
        assert!(records.delete(s, &user, "a").await.unwrap(), "{}", b.name);
        assert!(!records.delete(s, &user, "a").await.unwrap(), "{}", b.name);
        assert!(!records.delete(s, &user, "zz").await.unwrap(), "{}", b.name);
        let held = records.of(s, &user).await.unwrap();
        assert_eq!((held.version, ids(&held)), (2, vec!["b"]), "{}", b.name);
        if b.storage.persistent() {
            let held = Records::default().of(s, &user).await.unwrap();
            assert_eq!((held.version, ids(&held)), (2, vec!["b"]), "{}", b.name);
        }
    }
}

#[tokio::test]
async fn forget_removes_every_record_and_says_when() {
    for b in backends("forget").await {
        let (s, records) = (&*b.storage, Records::default());
        let user = unique("forget");
        let put = vec![rec("a", "one", vec![1.0]), rec("b", "two", vec![2.0])];
        assert!(records.change(s, &user, 0, put, vec![]).await.unwrap());
        assert_eq!(
            records.forget(s, &user, 1234).await.unwrap(),
            2,
            "{}",
            b.name
        );
        let gone = Held {
            version: 2,
            forgotten_at: 1234,
            records: vec![],
        };
        assert_eq!(*records.of(s, &user).await.unwrap(), gone, "{}", b.name);
        if b.storage.persistent() {
            assert_eq!(*Records::default().of(s, &user).await.unwrap(), gone);
        }
        // Forgetting again removes none, and still moves the version.
        assert_eq!(records.forget(s, &user, 2000).await.unwrap(), 0);
        assert_eq!(records.of(s, &user).await.unwrap().version, 3);
        if b.name == "redis" {
            let url = b.config.url.clone().unwrap();
            let mut conn = ::redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let p = &b.config.key_prefix;
            let keys = [
                format!("{p}:{{u:{user}}}:rec"),
                format!("{p}:{{u:{user}}}:vec"),
            ];
            let left: i64 = ::redis::cmd("EXISTS")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(left, 0);
        }
    }
}

#[tokio::test]
async fn recalled_sets_the_time_without_moving_the_version() {
    for b in backends("recalled").await {
        let (s, records) = (&*b.storage, Records::default());
        let user = unique("recalled");
        let put = vec![rec("a", "one", vec![1.0]), rec("b", "two", vec![2.0])];
        assert!(records.change(s, &user, 0, put, vec![]).await.unwrap());
        let other = Records::default();
        other.of(s, &user).await.unwrap();
        let asked = ["b".to_owned(), "gone".to_owned()];
        records.recalled(s, &user, &asked, 777).await.unwrap();
        let mut readers = vec![records];
        if b.storage.persistent() {
            readers.push(Records::default());
        }
        for r in &readers {
            let held = r.of(s, &user).await.unwrap();
            assert_eq!(held.version, 1, "{}", b.name);
            assert_eq!(ids(&held), ["a", "b"], "{}", b.name);
            assert_eq!(held.records[0].recalled_at, 0, "{}", b.name);
            assert_eq!(held.records[1].recalled_at, 777, "{}", b.name);
            assert_eq!(*held.records[1].embedding, [2.0], "{}", b.name);
        }
        if b.name == "redis" {
            // Another replica's copy is still current: nothing to reload.
            let held = other.of(s, &user).await.unwrap();
            assert_eq!((held.version, held.records[1].recalled_at), (1, 0));
        }
    }
}

#[tokio::test]
async fn sqlite_records_outlive_the_process() {
    let b = sqlite("reopen").await;
    let user = unique("reopen");
    let put = vec![rec("a", "one", vec![0.5, -1.5])];
    let records = Records::default();
    assert!(records
        .change(&b.storage, &user, 0, put, vec![])
        .await
        .unwrap());
    records
        .recalled(&b.storage, &user, &["a".into()], 99)
        .await
        .unwrap();
    let Backend {
        storage,
        config,
        _db,
        ..
    } = b;
    drop(storage);
    let again = Storage::open(&config, &Unmeasured).await.unwrap();
    let held = Records::default().of(&again, &user).await.unwrap();
    assert_eq!((held.version, ids(&held)), (1, vec!["a"]));
    assert_eq!(*held.records[0].embedding, [0.5, -1.5]);
    assert_eq!(held.records[0].recalled_at, 99);
}

#[tokio::test]
async fn sqlite_corrupt_records_are_reported_as_such() {
    let b = sqlite("corrupt").await;
    let user = unique("corrupt");
    {
        let conn = rusqlite::Connection::open(&b.config.path).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .unwrap();
        conn.execute(
            "INSERT INTO memory_records (user, id, body, embedding) VALUES (?1, 'a', ?2, x'000000')",
            [&user, &body(&rec("a", "one", vec![])).unwrap()],
        )
        .unwrap();
    }
    let err = Records::default().of(&b.storage, &user).await.unwrap_err();
    assert!(matches!(err, StorageError::Corrupt(_)), "{err}");
}

#[tokio::test]
async fn redis_replicas_see_each_others_changes() {
    let Some(config) = redis_config("replicas") else {
        return;
    };
    let metrics = Unmeasured;
    let one = Storage::open(&config, &metrics).await.unwrap();
    let two = Storage::open(&config, &metrics).await.unwrap();
    let (here, there) = (Records::default(), Records::default());
    let user = unique("replicas");
    assert_eq!(there.of(&two, &user).await.unwrap().version, 0);
    let put = vec![rec("a", "one", vec![1.0])];
    assert!(here.change(&one, &user, 0, put, vec![]).await.unwrap());
    let held = there.of(&two, &user).await.unwrap();
    assert_eq!((held.version, ids(&held)), (1, vec!["a"]));
    // The other replica's cache was at 1 too: a change there at 0 is stale.
    let put = vec![rec("b", "two", vec![2.0])];
    assert!(!here
        .change(&one, &user, 0, put.clone(), vec![])
        .await
        .unwrap());
    assert!(there.change(&two, &user, 1, put, vec![]).await.unwrap());
    assert!(here.delete(&one, &user, "a").await.unwrap());
    let held = there.of(&two, &user).await.unwrap();
    assert_eq!((held.version, ids(&held)), (3, vec!["b"]));
    assert_eq!(there.forget(&two, &user, 5).await.unwrap(), 1);
    let held = here.of(&one, &user).await.unwrap();
    assert_eq!(
        (held.version, held.forgotten_at, held.records.len()),
        (4, 5, 0)
    );
}

#[tokio::test]
async fn redis_corrupt_records_are_reported_as_such() {
    let Some(config) = redis_config("corrupt") else {
        return;
    };
    let storage = Storage::open(&config, &Unmeasured).await.unwrap();
    let user = unique("corrupt");
    let mut conn = ::redis::Client::open(config.url.clone().unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let p = &config.key_prefix;
    let _: () = ::redis::pipe()
        .cmd("HSET")
        .arg(format!("{p}:{{u:{user}}}:rec"))
        .arg("a")
        .arg("not json")
        .ignore()
        .cmd("HSET")
        .arg(format!("{p}:{{u:{user}}}:vec"))
        .arg("a")
        .arg(&[0u8; 4][..])
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = Records::default().of(&storage, &user).await.unwrap_err();
    assert!(matches!(err, StorageError::Corrupt(_)), "{err}");
}

#[test]
fn an_embedding_blob_is_exact_and_whole() {
    let v = vec![1.0, -0.0, f32::MAX, f32::MIN_POSITIVE];
    assert_eq!(bits(&from_blob(&to_blob(&v)).unwrap()), bits(&v));
    assert!(matches!(from_blob(&[0; 5]), Err(StorageError::Corrupt(_))));
    assert!(!body(&rec("a", "t", v)).unwrap().contains("embedding"));
}
