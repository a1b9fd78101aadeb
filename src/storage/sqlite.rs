//! Embedded SQLite: no server, WAL mode, one writer thread that commits
//! whatever has queued up in a single transaction (group commit), and a
//! separate connection for reads, which WAL lets run beside the writer.

use std::path::Path;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::histogram::Histogram;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use super::{Batch, Listed, Loaded, Meta, Op, StorageError, Ticket};
use crate::config::{StorageConfig, SyncMode};
use crate::message::Message;

/// Batches larger than this are split, to bound one transaction's size.
const MAX_BATCH_OPS: usize = 4096;

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
];

pub struct Sqlite {
    tx: mpsc::UnboundedSender<Batch>,
    reader: Arc<Mutex<Connection>>,
}

impl Sqlite {
    pub async fn open(config: &StorageConfig, writes: Histogram) -> Result<Self, StorageError> {
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
            // Checkpoints copy the WAL back into the database and sync it:
            // on the writer they would stall every commit queued behind
            // them, so a thread of their own does them.
            writer.pragma_update(None, "wal_autocheckpoint", 0)?;
            let reader = connect(&path)?;
            let checkpointer = connect(&path)?;
            Ok((writer, (reader, checkpointer)))
        })
        .await
        .map_err(|e| StorageError::Task(e.to_string()))??;
        let (reader, checkpointer) = reader;

        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("recall-sqlite-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpointer))
            .map_err(|e| StorageError::Task(e.to_string()))?;
        std::thread::Builder::new()
            .name("recall-sqlite-writer".into())
            .spawn(move || write_loop(writer, rx, writes))
            .map_err(|e| StorageError::Task(e.to_string()))?;
        tracing::info!(path = %config.path, "sqlite storage open");
        Ok(Self {
            tx,
            reader: Arc::new(Mutex::new(reader)),
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
                    "SELECT created_ms, last_active_ms, turn_id, first_seq, users, system_messages
                     FROM sessions WHERE id = ?1",
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
                "SELECT id, created_ms, last_active_ms, turn_id, first_seq, users, system_messages,
                        (SELECT COUNT(*) FROM messages WHERE session_id = sessions.id)
                 FROM sessions
                 WHERE id > ?1
                   AND (?2 IS NULL OR EXISTS (SELECT 1 FROM json_each(sessions.users) WHERE value = ?2))
                 ORDER BY id LIMIT ?3",
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
                "SELECT id FROM sessions WHERE last_active_ms < ?1 ORDER BY last_active_ms LIMIT ?2",
            )?;
            let ids = stmt
                .query_map(params![cutoff_ms, limit as i64], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(ids)
        })
        .await
    }
}

/// Moves committed pages from the WAL into the database once a second,
/// without blocking the writer (PASSIVE), for as long as the process runs.
fn checkpoint_loop(conn: Connection) {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "sqlite checkpoint failed");
        }
    }
}

fn connect(path: &str) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
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

/// The writer thread: take what has queued up, commit it as one
/// transaction, then tell every waiter.
fn write_loop(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Batch>, writes: Histogram) {
    raise_priority();
    while let Some(first) = rx.blocking_recv() {
        let (batches, ops) = super::gather(first, &mut rx, MAX_BATCH_OPS);
        let started = std::time::Instant::now();
        let result = apply(&mut conn, &batches);
        writes.observe(started.elapsed().as_secs_f64());
        let result = result.map_err(|e| {
            tracing::error!(error = %e, ops, "sqlite write failed");
            e.to_string()
        });
        super::settle(batches, &result);
    }
    tracing::debug!("sqlite writer stopped");
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

fn apply(conn: &mut Connection, batches: &[Batch]) -> Result<(), StorageError> {
    let tx = conn.transaction()?;
    for op in batches.iter().flat_map(|b| &b.ops) {
        match op {
            Op::Save { id, meta } => {
                let users = serde_json::to_string(&meta.users).unwrap_or_else(|_| "[]".into());
                let system =
                    serde_json::to_string(&meta.system_messages).unwrap_or_else(|_| "[]".into());
                tx.prepare_cached(
                    "INSERT INTO sessions (id, created_ms, last_active_ms, turn_id, first_seq, users, system_messages)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (id) DO UPDATE SET last_active_ms = ?3, turn_id = ?4, first_seq = ?5,
                         users = ?6, system_messages = ?7",
                )?
                .execute(params![
                    id,
                    meta.created_ms,
                    meta.last_active_ms,
                    meta.turn_id as i64,
                    meta.first_seq as i64,
                    users,
                    system
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
                tx.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
                    .execute([id])?;
            }
            // A process of its own needs no lease.
            Op::Release { .. } => {}
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
    tx.commit()?;
    Ok(())
}
