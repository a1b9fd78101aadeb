//! Embedded SQLite: no server, WAL mode, one writer thread that commits
//! whatever has queued up in a single transaction (group commit), and a
//! separate connection for reads, which WAL lets run beside the writer.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::histogram::Histogram;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use super::{Batch, Faults, Fences, Listed, Loaded, Meta, Op, StorageError, Ticket};
use crate::config::{StorageConfig, SyncMode};
use crate::memory::message::Message;

/// Batches larger than this are split, to bound one transaction's size.
const MAX_BATCH_OPS: usize = 4096;

/// Pages of a new database. A turn dirties a handful of pages (a message
/// leaf, the session's row, its place in the activity index), each
/// written whole to the WAL and again by the checkpoint; at 1 KiB rather
/// than SQLite's 4 KiB a turn wrote 15 KB instead of 38 KB.
const PAGE_SIZE: i64 = 1024;

/// When the WAL is copied back and started over (see `checkpoint_loop`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WalLimits {
    /// WAL pages after which the writer is asked to let it start over.
    pub restart_pages: i64,
    /// How large a WAL file is kept for reuse when it starts over.
    pub keep_bytes: i64,
    /// How often the checkpoint thread copies the WAL back.
    pub every: std::time::Duration,
}

impl Default for WalLimits {
    fn default() -> Self {
        Self {
            restart_pages: 16384,
            keep_bytes: 32 << 20,
            every: std::time::Duration::from_millis(10),
        }
    }
}

/// Schema versions, applied in order; `PRAGMA user_version` says how many
/// have run. Never edit one that has shipped: add the next.
const MIGRATIONS: &[&str] = &[
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
];

/// What the writer and the checkpoint thread tell each other.
#[derive(Default)]
struct Signals {
    /// The WAL has grown past its limit and the checkpoint thread has just
    /// copied nearly all of it back.
    restart: AtomicBool,
    /// The writer has stopped (the storage was dropped): so does the
    /// checkpoint thread.
    stopped: AtomicBool,
}

pub struct Sqlite {
    tx: mpsc::UnboundedSender<Batch>,
    reader: Arc<Mutex<Connection>>,
    /// Sessions whose writes failed (see `Fences`).
    pub(crate) fences: Arc<Fences>,
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) faults: Arc<Faults>,
}

impl Sqlite {
    pub async fn open(config: &StorageConfig, writes: Histogram) -> Result<Self, StorageError> {
        Self::open_with(config, writes, WalLimits::default()).await
    }

    pub(crate) async fn open_with(
        config: &StorageConfig,
        writes: Histogram,
        wal: WalLimits,
    ) -> Result<Self, StorageError> {
        let path = config.path.clone();
        let sync = config.sync;
        let (writer, reader) = tokio::task::spawn_blocking(move || -> Result<_, StorageError> {
            if let Some(dir) = Path::new(&path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir).map_err(|source| StorageError::Dir {
                    path: dir.display().to_string(),
                    source,
                })?;
            }
            let writer = connect(&path)?;
            writer.pragma_update(
                None,
                "synchronous",
                match sync {
                    SyncMode::Full => "FULL",
                    SyncMode::Normal => "NORMAL",
                },
            )?;
            migrate(&writer)?;
            // Checkpoints copy the WAL back into the database and sync
            // both, which on the writer would stall every commit queued
            // behind it, so a thread of its own does them (see
            // `checkpoint_loop` for how the WAL still gets to start over).
            writer.pragma_update(None, "wal_autocheckpoint", 0)?;
            // A WAL that did grow (a reader held it) is cut back when it
            // starts over.
            writer.pragma_update(None, "journal_size_limit", wal.keep_bytes)?;
            // Each batch has a savepoint (`apply_round`): the pages it
            // would roll back are kept in memory, not in a temporary file.
            writer.pragma_update(None, "temp_store", "MEMORY")?;
            let reader = connect(&path)?;
            let checkpointer = connect(&path)?;
            Ok((writer, (reader, checkpointer)))
        })
        .await
        .map_err(|e| StorageError::Task(e.to_string()))??;
        let (reader, checkpointer) = reader;

        let (tx, rx) = mpsc::unbounded_channel();
        let fences = Arc::new(Fences::default());
        let faults: Arc<Faults> = Arc::default();
        let writer_side = Writer {
            writes,
            signals: Arc::new(Signals::default()),
            fences: Arc::clone(&fences),
            faults: Arc::clone(&faults),
        };
        let signals = Arc::clone(&writer_side.signals);
        let theirs = Arc::clone(&signals);
        std::thread::Builder::new()
            .name("recall-sqlite-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpointer, wal, &theirs))
            .map_err(|e| StorageError::Task(e.to_string()))?;
        std::thread::Builder::new()
            .name("recall-sqlite-writer".into())
            .spawn(move || write_loop(writer, rx, &writer_side))
            .map_err(|e| StorageError::Task(e.to_string()))?;
        tracing::info!(path = %config.path, "sqlite storage open");
        Ok(Self {
            tx,
            reader: Arc::new(Mutex::new(reader)),
            fences,
            faults,
        })
    }

    pub fn submit(&self, ops: Vec<Op>) -> Ticket {
        let (done, rx) = oneshot::channel();
        let batch = Batch {
            ops,
            done: Some(done),
        };
        if self.tx.send(batch).is_err() {
            tracing::error!("sqlite writer has stopped; a change was not stored");
        }
        Ticket::pending(rx)
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            let conn = reader.lock().unwrap_or_else(|e| e.into_inner());
            f(&conn)
        })
        .await
        .map_err(|e| StorageError::Task(e.to_string()))?
    }

    pub async fn load(&self, id: &str) -> Result<Option<Loaded>, StorageError> {
        let id = id.to_owned();
        self.read(move |conn| {
            let Some(meta) = conn
                .query_row(
                    "SELECT s.created_ms, t.last_active_ms, t.turn_id, t.first_seq, s.users,
                            s.system_messages
                     FROM sessions s JOIN session_state t ON t.id = s.id WHERE s.id = ?1",
                    [&id],
                    meta_from_row,
                )
                .optional()?
            else {
                return Ok(None);
            };
            let meta = meta?;
            let mut stmt = conn
                .prepare_cached("SELECT body FROM messages WHERE session_id = ?1 ORDER BY seq")?;
            let messages = stmt
                .query_map([&id], |row| row.get::<_, String>(0))?
                .map(|body| {
                    let body = body?;
                    serde_json::from_str::<Message>(&body)
                        .map_err(|e| StorageError::Corrupt(format!("message of {id}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(Loaded { meta, messages }))
        })
        .await
    }

    pub async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
        user: Option<&str>,
    ) -> Result<Vec<Listed>, StorageError> {
        let after = after.unwrap_or("").to_owned();
        let user = user.map(str::to_owned);
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT s.id, s.created_ms, t.last_active_ms, t.turn_id, t.first_seq, s.users,
                        s.system_messages,
                        (SELECT COUNT(*) FROM messages WHERE session_id = s.id)
                 FROM sessions s JOIN session_state t ON t.id = s.id
                 WHERE s.id > ?1
                   AND (?2 IS NULL OR EXISTS (SELECT 1 FROM json_each(s.users) WHERE value = ?2))
                 ORDER BY s.id LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![after, user, limit as i64], |row| {
                let id: String = row.get(0)?;
                let count: i64 = row.get(7)?;
                let meta = meta_from_row_at(row, 1)?;
                Ok((id, meta, count))
            })?;
            rows.map(|r| {
                let (id, meta, count) = r?;
                Ok(Listed {
                    id,
                    meta: meta?,
                    message_count: count as usize,
                })
            })
            .collect()
        })
        .await
    }

    pub async fn kept_events(&self) -> Result<Vec<(String, String)>, StorageError> {
        self.read(|conn| {
            let mut stmt =
                conn.prepare_cached("SELECT id, body FROM undelivered_events ORDER BY id")?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<(String, String)>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// One kept event's body, if it is still kept.
    pub async fn kept_event(&self, id: &str) -> Result<Option<String>, StorageError> {
        let id = id.to_owned();
        self.read(move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT body FROM undelivered_events WHERE id = ?1")?;
            let mut rows = stmt.query_map([&id], |r| r.get(0))?;
            Ok(rows.next().transpose()?)
        })
        .await
    }

    pub async fn count(&self) -> Result<usize, StorageError> {
        self.read(|conn| {
            let n: i64 = conn.query_row("SELECT COUNT(*) FROM sessions", [], |r| r.get(0))?;
            Ok(n as usize)
        })
        .await
    }

    pub async fn idle(&self, cutoff_ms: i64, limit: usize) -> Result<Vec<String>, StorageError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id FROM session_state WHERE last_active_ms < ?1
                 ORDER BY last_active_ms LIMIT ?2",
            )?;
            let ids = stmt
                .query_map(params![cutoff_ms, limit as i64], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(ids)
        })
        .await
    }
}

/// Moves committed pages from the WAL into the database, without blocking
/// the writer (PASSIVE), for as long as the process runs.
///
/// The WAL only starts over from its beginning when a write finds it
/// wholly copied back, which a checkpoint running beside a busy writer
/// never achieves: left to this thread alone, the WAL grew by gigabytes a
/// minute under load. Nor may the writer checkpoint on its own schedule:
/// a checkpoint syncs what it copies, and one over a large WAL stalled
/// every queued commit for 10 to 40 ms. So once the WAL is large, right
/// after a pass (when what is left to copy and sync is only what was
/// written during it) this thread asks the writer for a checkpoint, which
/// then costs about a millisecond and lets the WAL start over.
fn checkpoint_loop(conn: Connection, wal: WalLimits, signals: &Signals) {
    while !signals.stopped.load(Ordering::Relaxed) {
        std::thread::sleep(wal.every);
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1)) {
            Ok(pages) if pages >= wal.restart_pages => {
                signals.restart.store(true, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sqlite checkpoint failed"),
        }
    }
}

fn connect(path: &str) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // Takes effect only on a new database, so it must come before WAL mode
    // writes the file's header; an existing database keeps its own.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    Ok(conn)
}

fn migrate(conn: &Connection) -> Result<(), StorageError> {
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

type MetaResult = Result<Meta, StorageError>;

fn meta_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<MetaResult> {
    meta_from_row_at(row, 0)
}

fn meta_from_row_at(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<MetaResult> {
    let users: String = row.get(at + 4)?;
    let system: String = row.get(at + 5)?;
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
        })
    })();
    Ok(parsed)
}

/// What the writer thread shares with the rest.
struct Writer {
    writes: Histogram,
    signals: Arc<Signals>,
    fences: Arc<Fences>,
    faults: Arc<Faults>,
}

/// The writer thread: take what has queued up, commit it as one
/// transaction, then tell every waiter how its batch went.
fn write_loop(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Batch>, w: &Writer) {
    raise_priority();
    while let Some(first) = rx.blocking_recv() {
        while w.faults.is_paused() {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let started = std::time::Instant::now();
        if w.signals.restart.swap(false, Ordering::Relaxed) {
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::warn!(error = %e, "sqlite checkpoint failed");
            }
        }
        let (batches, ops) = super::gather(first, &mut rx, MAX_BATCH_OPS);
        let results = apply_round(&mut conn, &batches, w);
        w.writes.observe(started.elapsed().as_secs_f64());
        let failed = results.iter().filter(|r| r.is_err()).count();
        if failed > 0 {
            tracing::error!(ops, batches = batches.len(), failed, "sqlite writes failed");
        }
        for (b, r) in batches.iter().zip(&results) {
            w.fences.settled(b, r);
        }
        super::settle(batches, results);
    }
    w.signals.stopped.store(true, Ordering::Relaxed);
    tracing::debug!("sqlite writer stopped");
}

/// One round: a transaction in which each batch (one session's change)
/// has a savepoint of its own. A batch that fails is rolled back to its
/// savepoint and fails alone; the others commit. A failed commit, or an
/// error after which SQLite rolled the whole transaction back (it may,
/// for a full disk or an I/O error), fails them all.
fn apply_round(conn: &mut Connection, batches: &[Batch], w: &Writer) -> Vec<Result<(), String>> {
    let all_fail = |e: &dyn std::fmt::Display| vec![Err(e.to_string()); batches.len()];
    let tx = match conn.transaction() {
        Ok(tx) => tx,
        Err(e) => {
            tracing::error!(error = %e, "sqlite write failed");
            return all_fail(&e);
        }
    };
    let mut results = Vec::with_capacity(batches.len());
    for b in batches {
        if let Err(refused) = w.fences.admits(b) {
            results.push(Err(refused));
            continue;
        }
        if b.ops.is_empty() {
            results.push(Ok(()));
            continue;
        }
        let applied = in_savepoint(&tx, b, &w.faults);
        if let Err(e) = &applied {
            tracing::error!(error = %e, session = ?b.session(), "sqlite write failed");
            if tx.is_autocommit() {
                // SQLite gave up the whole transaction: nothing of the
                // round is stored.
                return all_fail(e);
            }
        }
        // Later batches of a session whose batch failed are refused.
        let applied = applied.map_err(|e| e.to_string());
        w.fences.settled(b, &applied);
        results.push(applied);
    }
    let committed = if w.faults.round_fails(batches.len()) {
        Err(StorageError::Failed(
            "injected fault: the commit failed".into(),
        ))
    } else {
        tx.commit().map_err(StorageError::from)
    };
    if let Err(e) = committed {
        tracing::error!(error = %e, "sqlite commit failed");
        return all_fail(&e);
    }
    results
}

/// Applies one batch within a savepoint, rolled back if any op fails.
fn in_savepoint(
    tx: &rusqlite::Transaction<'_>,
    batch: &Batch,
    faults: &Faults,
) -> Result<(), StorageError> {
    tx.prepare_cached("SAVEPOINT batch")?.execute([])?;
    let applied = apply(tx, &batch.ops).and_then(|()| {
        if faults.batch_fails(batch) {
            Err(StorageError::Failed(
                "injected fault: this write failed".into(),
            ))
        } else {
            Ok(())
        }
    });
    match applied {
        Ok(()) => {
            tx.prepare_cached("RELEASE batch")?.execute([])?;
            Ok(())
        }
        Err(e) => {
            if !tx.is_autocommit() {
                // Undoes the batch; RELEASE then ends the savepoint.
                tx.execute_batch("ROLLBACK TO batch; RELEASE batch")?;
            }
            Err(e)
        }
    }
}

fn to_json(message: &Message) -> Result<String, StorageError> {
    serde_json::to_string(message).map_err(|e| StorageError::Corrupt(e.to_string()))
}

/// Replies wait on this thread's commits before their end is released, so
/// under load it must not queue behind the threads relaying chunks: ask for
/// a higher scheduling priority (best effort; it needs CAP_SYS_NICE).
fn raise_priority() {
    // SAFETY: setpriority only reads its integer arguments; on Linux,
    // PRIO_PROCESS with who = 0 applies to the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    if rc != 0 {
        tracing::debug!("sqlite writer runs at normal priority (no CAP_SYS_NICE)");
    }
}

fn apply(tx: &Connection, ops: &[Op]) -> Result<(), StorageError> {
    for op in ops {
        match op {
            Op::Save { id, meta } => {
                let users = serde_json::to_string(&meta.users).unwrap_or_else(|_| "[]".into());
                let system =
                    serde_json::to_string(&meta.system_messages).unwrap_or_else(|_| "[]".into());
                tx.prepare_cached(
                    "INSERT INTO sessions (id, created_ms, users, system_messages)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (id) DO UPDATE SET users = ?3, system_messages = ?4",
                )?
                .execute(params![id, meta.created_ms, users, system])?;
                tx.prepare_cached(
                    "INSERT INTO session_state (id, last_active_ms, turn_id, first_seq)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (id) DO UPDATE SET last_active_ms = ?2, turn_id = ?3,
                         first_seq = ?4",
                )?
                .execute(params![
                    id,
                    meta.last_active_ms,
                    meta.turn_id as i64,
                    meta.first_seq as i64
                ])?;
            }
            Op::Touch {
                id,
                created_ms,
                last_active_ms,
                turn_id,
                first_seq,
            } => {
                // A lookup when the row exists, which it almost always does.
                tx.prepare_cached(
                    "INSERT INTO sessions (id, created_ms, users, system_messages)
                     VALUES (?1, ?2, '[]', '[]') ON CONFLICT (id) DO NOTHING",
                )?
                .execute(params![id, created_ms])?;
                tx.prepare_cached(
                    "INSERT INTO session_state (id, last_active_ms, turn_id, first_seq)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (id) DO UPDATE SET last_active_ms = ?2, turn_id = ?3,
                         first_seq = ?4",
                )?
                .execute(params![
                    id,
                    last_active_ms,
                    *turn_id as i64,
                    *first_seq as i64
                ])?;
            }
            Op::Push { id, seq, message } => {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO messages (session_id, seq, body) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![id, *seq as i64, to_json(message)?])?;
            }
            // An update to a message trimmed meanwhile changes nothing.
            Op::Set { id, seq, message } => {
                tx.prepare_cached(
                    "UPDATE messages SET body = ?3 WHERE session_id = ?1 AND seq = ?2",
                )?
                .execute(params![id, *seq as i64, to_json(message)?])?;
            }
            Op::DropBefore { id, seq, .. } => {
                tx.prepare_cached("DELETE FROM messages WHERE session_id = ?1 AND seq < ?2")?
                    .execute(params![id, *seq as i64])?;
            }
            Op::Clear { id } => {
                tx.prepare_cached("DELETE FROM messages WHERE session_id = ?1")?
                    .execute([id])?;
            }
            Op::Delete { id, .. } => {
                tx.prepare_cached("DELETE FROM messages WHERE session_id = ?1")?
                    .execute([id])?;
                tx.prepare_cached("DELETE FROM session_state WHERE id = ?1")?
                    .execute([id])?;
                tx.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
                    .execute([id])?;
            }
            // A process of its own needs no lease; a resumption is the
            // writer's business (`Fences`).
            Op::Release { .. } | Op::Resume { .. } => {}
            Op::KeepEvent { id, body } => {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO undelivered_events (id, body) VALUES (?1, ?2)",
                )?
                .execute([id, body])?;
            }
            Op::ForgetEvent { id } => {
                tx.prepare_cached("DELETE FROM undelivered_events WHERE id = ?1")?
                    .execute([id])?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[tokio::test]
    async fn a_version_2_database_is_migrated_with_its_sessions() {
        let db_file = TempDb::new("migrate");
        let path = db_file.0.clone();
        {
            let conn = Connection::open(&path).unwrap();
            for (i, sql) in MIGRATIONS[..2].iter().enumerate() {
                conn.execute_batch(&format!("{sql}; PRAGMA user_version = {};", i + 1))
                    .unwrap();
            }
            conn.execute(
                "INSERT INTO sessions VALUES ('old', 5, 70, 3, 2, '[\"ann\"]',
                 '[{\"role\":\"system\",\"content\":\"be brief\"}]')",
                [],
            )
            .unwrap();
            for (seq, text) in [(2, "hi"), (3, "hello")] {
                let body = serde_json::to_string(&message("user", text)).unwrap();
                conn.execute(
                    "INSERT INTO messages VALUES ('old', ?1, ?2)",
                    params![seq, body],
                )
                .unwrap();
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
        };
        db.submit(vec![Op::Save {
            id: "s".into(),
            meta,
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
}
