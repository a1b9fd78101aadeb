//! The SQLite backend on real database files.

use super::schema::MIGRATIONS;
use super::*;
use crate::Meta;
use prometheus_client::metrics::histogram::exponential_buckets;

/// A database file that is removed, with its WAL, when dropped.
struct TempDb(String);

impl TempDb {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join("recall-sqlite-unit");
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

fn config(path: &str) -> StorageConfig {
    StorageConfig {
        path: path.to_owned(),
        ..StorageConfig::default()
    }
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.00002, 2.0, 15))
}

fn message(role: &str, content: &str) -> Message {
    serde_json::from_value(serde_json::json!({"role": role, "content": content})).unwrap()
}

/// A database as an older recall left it: the first `version` migrations,
/// on 1 KiB pages as recall creates them.
fn database_at_version(path: &str, version: usize) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "page_size", super::schema::PAGE_SIZE)
        .unwrap();
    for (i, sql) in MIGRATIONS[..version].iter().enumerate() {
        conn.execute_batch(&format!("{sql}; PRAGMA user_version = {};", i + 1))
            .unwrap();
    }
    conn
}

/// A user message of session `old`, in the messages table of versions 1
/// to 6 (session, sequence number, body).
fn store_old_message(conn: &Connection, seq: i64, text: &str) {
    let body = serde_json::to_string(&message("user", text)).unwrap();
    conn.execute(
        "INSERT INTO messages VALUES ('old', ?1, ?2)",
        params![seq, body],
    )
    .unwrap();
}

#[tokio::test]
async fn a_version_2_database_is_migrated_with_its_sessions() {
    let db_file = TempDb::new("migrate");
    let path = db_file.0.clone();
    {
        let conn = database_at_version(&path, 2);
        conn.execute(
            "INSERT INTO sessions VALUES ('old', 5, 70, 3, 2, '[\"ann\"]',
             '[{\"role\":\"system\",\"content\":\"be brief\"}]')",
            [],
        )
        .unwrap();
        for (seq, text) in [(2, "hi"), (3, "hello")] {
            store_old_message(&conn, seq, text);
        }
    }
    let db = Sqlite::open(&config(&path), histogram()).await.unwrap();
    let loaded = db.load("old").await.unwrap().expect("the session is kept");
    assert_eq!(loaded.meta.created_ms, 5);
    assert_eq!(loaded.meta.last_active_ms, 70);
    assert_eq!(loaded.meta.turn_id, 3);
    assert_eq!(loaded.meta.first_seq, 2);
    assert_eq!(loaded.meta.users, ["ann"]);
    assert_eq!(loaded.meta.system_messages[0].content, "be brief");
    assert_eq!(loaded.messages.len(), 2);
    assert_eq!(db.idle(71, 10).await.unwrap(), ["old"]);
    assert!(db.idle(70, 10).await.unwrap().is_empty());
    let listed = db.list(None, 10, Some("ann")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].message_count, 2);
    assert_eq!(listed[0].meta.turn_id, 3);
}

#[tokio::test]
async fn a_touch_moves_the_turn_and_keeps_users_and_system_messages() {
    let db_file = TempDb::new("touch");
    let path = db_file.0.clone();
    let db = Sqlite::open(&config(&path), histogram()).await.unwrap();
    let meta = Meta {
        created_ms: 1,
        last_active_ms: 1,
        turn_id: 1,
        first_seq: 0,
        users: vec!["bo".into()],
        system_messages: vec![message("system", "be kind")],
        metadata: Default::default(),
        remembered: Default::default(),
    };
    db.submit(vec![Op::Save {
        id: "s".into(),
        meta: Box::new(meta),
    }])
    .durable()
    .await
    .unwrap();
    db.submit(vec![
        Op::Touch {
            id: "s".into(),
            created_ms: 1,
            last_active_ms: 9,
            turn_id: 4,
            first_seq: 2,
        },
        // A touch of a session never saved (its Save failed) creates
        // it, without users or system messages: it can be loaded.
        Op::Touch {
            id: "ghost".into(),
            created_ms: 3,
            last_active_ms: 9,
            turn_id: 4,
            first_seq: 2,
        },
    ])
    .durable()
    .await
    .unwrap();
    let loaded = db.load("s").await.unwrap().unwrap();
    assert_eq!(
        (
            loaded.meta.last_active_ms,
            loaded.meta.turn_id,
            loaded.meta.first_seq
        ),
        (9, 4, 2)
    );
    assert_eq!(loaded.meta.users, ["bo"]);
    assert_eq!(loaded.meta.system_messages[0].content, "be kind");
    let ghost = db
        .load("ghost")
        .await
        .unwrap()
        .expect("a touch is an upsert");
    assert_eq!((ghost.meta.created_ms, ghost.meta.turn_id), (3, 4));
    assert!(ghost.meta.users.is_empty() && ghost.messages.is_empty());
    assert_eq!(db.count().await.unwrap(), 2);
    db.submit(vec![Op::Delete {
        id: "s".into(),
        users: vec!["bo".into()],
    }])
    .durable()
    .await
    .unwrap();
    assert!(db.load("s").await.unwrap().is_none());
    assert_eq!(db.idle(i64::MAX, 10).await.unwrap(), ["ghost"]);
}

/// Under writes that never pause, the WAL still starts over: it stays
/// near its limit while many times that much is written through it.
/// (With checkpoints only beside the writer it grew without bound.)
#[tokio::test]
async fn the_wal_starts_over_under_steady_writes() {
    let db_file = TempDb::new("wal");
    let path = db_file.0.clone();
    let limits = WalLimits {
        restart_pages: 256,
        keep_bytes: 512 << 10,
        every: std::time::Duration::from_millis(10),
    };
    let db = Sqlite::open_with(&config(&path), histogram(), limits)
        .await
        .unwrap();
    let wal = format!("{path}-wal");
    let text = "x".repeat(1000);
    let mut largest = 0;
    let mut written = 0usize;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seq = 0u64;
    // 40 MB through a WAL asked to start over at 256 KiB.
    while written < 40 << 20 && std::time::Instant::now() < deadline {
        let ops = (0..20)
            .map(|i| {
                seq += 1;
                Op::Push {
                    id: format!("s{}", (seq + i) % 50),
                    seq,
                    message: Arc::new(message("user", &text)),
                }
            })
            .collect();
        db.submit(ops).durable().await.unwrap();
        written += 20 * 1024;
        if let Ok(m) = std::fs::metadata(&wal) {
            largest = largest.max(m.len());
        }
    }
    assert!(written >= 40 << 20, "the writes did not finish in time");
    // Without the writer's checkpoint this WAL reached 165 MB. The
    // margin above the 256 KiB asked for covers a checkpoint thread
    // that other tests running beside this one keep off the CPU for a
    // moment (it once passed 8 MiB that way).
    assert!(
        largest < 24 << 20,
        "the WAL grew to {largest} bytes while {written} were written"
    );
}

/// Migration 7: a database of version 6 keeps its messages, long ones
/// included, in order; they then live in a rowid table found through a
/// small index of their keys, not in the key's own b-tree, where every
/// comparison on the way to an insert read a long message's overflow
/// pages. A message pushed again under its sequence number replaces it.
#[tokio::test]
async fn messages_move_out_of_their_keys_b_tree_and_keep_their_order() {
    let db_file = TempDb::new("rowid");
    let path = db_file.0.clone();
    let long = "y".repeat(5000);
    {
        let conn = database_at_version(&path, 6);
        conn.execute(
            "INSERT INTO sessions (id, created_ms, users, system_messages) VALUES ('old', 5, '[]', '[]')",
            [],
        )
        .unwrap();
        conn.execute("INSERT INTO session_state VALUES ('old', 70, 3, 1)", [])
            .unwrap();
        for (seq, text) in [(3, "third"), (1, long.as_str()), (2, "second")] {
            store_old_message(&conn, seq, text);
        }
    }
    let db = Sqlite::open(&config(&path), histogram()).await.unwrap();
    let loaded = db.load("old").await.unwrap().expect("the session is kept");
    let texts: Vec<_> = loaded
        .messages
        .iter()
        .filter_map(|m| m.content_str())
        .collect();
    assert_eq!(texts, [long.as_str(), "second", "third"]);
    db.submit(vec![Op::Push {
        id: "old".into(),
        seq: 2,
        message: Arc::new(message("user", "second, again")),
    }])
    .durable()
    .await
    .unwrap();
    let loaded = db.load("old").await.unwrap().unwrap();
    let texts: Vec<_> = loaded
        .messages
        .iter()
        .filter_map(|m| m.content_str())
        .collect();
    assert_eq!(texts, [long.as_str(), "second, again", "third"]);

    let conn = Connection::open(&path).unwrap();
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!sql.contains("WITHOUT ROWID"), "{sql}");
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT body FROM messages WHERE session_id = 'old' ORDER BY seq",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("messages_by_session"), "{plan}");
}
