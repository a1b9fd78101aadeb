//! The database's schema, its migrations, and how a row becomes a meta.

use rusqlite::Connection;

use super::super::{Meta, StorageError};

/// Pages of a new database. A turn dirties a handful of pages (a message
/// leaf, the session's row, its place in the activity index), each
/// written whole to the WAL and again by the checkpoint, so smaller pages
/// than SQLite's 4 KiB write less a turn (docs/perf-journal.md, item 25).
pub(super) const PAGE_SIZE: i64 = 1024;

/// Schema versions, applied in order; `PRAGMA user_version` says how many
/// have run. Never edit one that has shipped: add the next.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: sessions and their messages.
    "CREATE TABLE sessions (
         id TEXT PRIMARY KEY,
         created_ms INTEGER NOT NULL,
         last_active_ms INTEGER NOT NULL,
         turn_id INTEGER NOT NULL,
         first_seq INTEGER NOT NULL,
         users TEXT NOT NULL,
         system_messages TEXT NOT NULL
     );
     CREATE INDEX sessions_by_activity ON sessions (last_active_ms);
     CREATE TABLE messages (
         session_id TEXT NOT NULL,
         seq INTEGER NOT NULL,
         body TEXT NOT NULL,
         PRIMARY KEY (session_id, seq)
     ) WITHOUT ROWID;",
    // 2: webhook events that could not be delivered.
    "CREATE TABLE undelivered_events (
         id TEXT PRIMARY KEY,
         body TEXT NOT NULL
     );",
    // 3: what moves with every turn, in a small row of its own, so that a
    // turn does not rewrite the users and system messages (a long system
    // prompt) beside it.
    "CREATE TABLE session_state (
         id TEXT PRIMARY KEY,
         last_active_ms INTEGER NOT NULL,
         turn_id INTEGER NOT NULL,
         first_seq INTEGER NOT NULL
     ) WITHOUT ROWID;
     INSERT INTO session_state SELECT id, last_active_ms, turn_id, first_seq FROM sessions;
     DROP INDEX sessions_by_activity;
     ALTER TABLE sessions DROP COLUMN last_active_ms;
     ALTER TABLE sessions DROP COLUMN turn_id;
     ALTER TABLE sessions DROP COLUMN first_seq;
     CREATE INDEX session_state_by_activity ON session_state (last_active_ms);",
    // 4: a conversation's metadata (the Conversations API).
    "ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}'",
    // 5: the running summary and the carried note; users' notes.
    "ALTER TABLE sessions ADD COLUMN remembered TEXT NOT NULL DEFAULT '{}';
     CREATE TABLE user_notes (
         user TEXT PRIMARY KEY,
         body TEXT NOT NULL
     ) WITHOUT ROWID;",
    // 6: users' long-term memory records and, per user, the version every
    // change moves and when all were last forgotten. A record carries its
    // embedding (1536 f32s are 6 KiB, several of these 1 KiB pages), and
    // SQLite advises WITHOUT ROWID only for rows under about a twentieth
    // of a page, so the records are an ordinary table (rows appended, the
    // blobs in overflow pages) with their key in an index of small entries.
    "CREATE TABLE memory_records (
         user TEXT NOT NULL,
         id TEXT NOT NULL,
         body TEXT NOT NULL,
         embedding BLOB NOT NULL,
         PRIMARY KEY (user, id)
     );
     CREATE TABLE memory_users (
         user TEXT PRIMARY KEY,
         version INTEGER NOT NULL,
         forgotten_at INTEGER NOT NULL
     ) WITHOUT ROWID;",
    // 7: messages in a rowid table, found by a small index of their keys.
    // WITHOUT ROWID kept each whole message in its key's b-tree, and a
    // message is larger than what a 1 KiB page holds of a key (about 230
    // bytes), so every comparison on the way to an insert read the
    // message's overflow pages (docs/perf-journal.md item 25).
    "CREATE TABLE messages_by_rowid (
         id INTEGER PRIMARY KEY,
         session_id TEXT NOT NULL,
         seq INTEGER NOT NULL,
         body TEXT NOT NULL
     );
     INSERT INTO messages_by_rowid (session_id, seq, body)
         SELECT session_id, seq, body FROM messages ORDER BY session_id, seq;
     DROP TABLE messages;
     ALTER TABLE messages_by_rowid RENAME TO messages;
     CREATE UNIQUE INDEX messages_by_session ON messages (session_id, seq);",
    // 8: recall's own jobs (a carry-over) until they have run.
    "CREATE TABLE kept_jobs (
         id TEXT PRIMARY KEY,
         body TEXT NOT NULL
     );",
];

pub(super) fn connect(path: &str) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // Takes effect only on a new database, so it must come before WAL mode
    // writes the file's header; an existing database keeps its own.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    Ok(conn)
}

/// A busy handler for connections that write beside another one: waits
/// 100 µs a try, for up to 5 s (SQLite's own sleeps grow to 100 ms, which
/// a turn would wait through for a lock held a millisecond).
pub(super) fn brief_waits(tries: i32) -> bool {
    std::thread::sleep(std::time::Duration::from_micros(100));
    tries < 50_000
}

pub(super) fn migrate(conn: &Connection) -> Result<(), StorageError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let version = usize::try_from(version).unwrap_or(0);
    if version > MIGRATIONS.len() {
        return Err(StorageError::Corrupt(format!(
            "database schema version {version} is newer than this recall ({})",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        conn.execute_batch(&format!(
            "BEGIN; {sql}; PRAGMA user_version = {}; COMMIT;",
            i + 1
        ))?;
        tracing::info!(version = i + 1, "sqlite schema migrated");
    }
    Ok(())
}

pub(super) fn meta_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<MetaResult> {
    meta_from_row_at(row, 0)
}

pub(super) fn meta_from_row_at(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<MetaResult> {
    let users: String = row.get(at + 4)?;
    let system: String = row.get(at + 5)?;
    let metadata: String = row.get(at + 6)?;
    let remembered: String = row.get(at + 7)?;
    let parsed = (|| -> MetaResult {
        Ok(Meta {
            created_ms: row.get(at).map_err(StorageError::from)?,
            last_active_ms: row.get(at + 1).map_err(StorageError::from)?,
            turn_id: row.get::<_, i64>(at + 2).map_err(StorageError::from)? as u64,
            first_seq: row.get::<_, i64>(at + 3).map_err(StorageError::from)? as u64,
            users: serde_json::from_str(&users)
                .map_err(|e| StorageError::Corrupt(e.to_string()))?,
            system_messages: serde_json::from_str(&system)
                .map_err(|e| StorageError::Corrupt(e.to_string()))?,
            metadata: serde_json::from_str(&metadata)
                .map_err(|e| StorageError::Corrupt(e.to_string()))?,
            remembered: serde_json::from_str(&remembered)
                .map_err(|e| StorageError::Corrupt(e.to_string()))?,
        })
    })();
    Ok(parsed)
}

pub(super) type MetaResult = Result<Meta, StorageError>;
