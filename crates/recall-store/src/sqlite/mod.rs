//! Embedded SQLite: no server, WAL mode, one writer thread that commits
//! whatever has queued up in a single transaction (group commit), and a
//! separate connection for reads, which WAL lets run beside the writer.
//! Users' memory records have a connection of their own (`records.rs`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::histogram::Histogram;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use super::{Batch, Faults, Fences, Kept, Listed, Loaded, Op, StorageError, Ticket};
use recall_core::config::{StorageConfig, SyncMode};
use recall_core::memory::message::Message;

pub(super) mod records;
mod schema;
#[cfg(test)]
mod tests;
mod writer;

use schema::{connect, meta_from_row, meta_from_row_at, migrate};
pub(crate) use writer::WalLimits;
use writer::{checkpoint_loop, write_loop, Signals, Writer};

/// The table `what` is kept in.
fn kept_table(what: Kept) -> &'static str {
    match what {
        Kept::Event => "undelivered_events",
        Kept::Job => "kept_jobs",
    }
}

pub struct Sqlite {
    tx: mpsc::UnboundedSender<Batch>,
    reader: Arc<Mutex<Connection>>,
    /// Writes and reads users' memory records (`records.rs`).
    records: Arc<Mutex<Connection>>,
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
            // Writes too: as the writer, it leaves checkpoints to their
            // thread and cuts a grown WAL back.
            let records = connect(&path)?;
            // Its commits do not sync (WAL with NORMAL: a power loss may
            // lose the last records written, never corrupt the file; a
            // session's facts are extracted again after a restart). A sync
            // held the write lock the turns' writer waits for.
            records.pragma_update(None, "synchronous", "NORMAL")?;
            // Both writers wait for each other's short transactions in
            // steps of 100 µs, not SQLite's 1, 2, 5, 10... ms.
            for conn in [&writer, &records] {
                conn.busy_handler(Some(schema::brief_waits))?;
            }
            records.pragma_update(None, "wal_autocheckpoint", 0)?;
            records.pragma_update(None, "journal_size_limit", wal.keep_bytes)?;
            Ok((writer, (reader, checkpointer, records)))
        })
        .await
        .map_err(|e| StorageError::Task(e.to_string()))??;
        let (reader, checkpointer, records) = reader;

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
            records: Arc::new(Mutex::new(records)),
            fences,
            faults,
        })
    }

    pub fn submit(&self, ops: Vec<Op>) -> Ticket {
        let (done, rx) = oneshot::channel();
        let batch = Batch {
            ops,
            done: Some(done),
            after: None,
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
                            s.system_messages, s.metadata, s.remembered
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
            Ok(Some(Loaded {
                meta,
                messages,
                version: 0,
            }))
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
                        s.system_messages, s.metadata, s.remembered,
                        (SELECT COUNT(*) FROM messages WHERE session_id = s.id)
                 FROM sessions s JOIN session_state t ON t.id = s.id
                 WHERE s.id > ?1
                   AND (?2 IS NULL OR EXISTS (SELECT 1 FROM json_each(s.users) WHERE value = ?2))
                 ORDER BY s.id LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![after, user, limit as i64], |row| {
                let id: String = row.get(0)?;
                let count: i64 = row.get(9)?;
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

    /// What is kept of `what`: ids and bodies, in id order.
    pub async fn kept(&self, what: Kept) -> Result<Vec<(String, String)>, StorageError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT id, body FROM {} ORDER BY id",
                kept_table(what)
            ))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<(String, String)>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// One kept event's or job's body, if it is still kept.
    pub async fn kept_one(&self, what: Kept, id: &str) -> Result<Option<String>, StorageError> {
        let id = id.to_owned();
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT body FROM {} WHERE id = ?1",
                kept_table(what)
            ))?;
            let mut rows = stmt.query_map([&id], |r| r.get(0))?;
            Ok(rows.next().transpose()?)
        })
        .await
    }

    /// A user's carried note, as stored.
    pub async fn note(&self, user: &str) -> Result<Option<String>, StorageError> {
        let user = user.to_owned();
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached("SELECT body FROM user_notes WHERE user = ?1")?;
            let mut rows = stmt.query_map([&user], |r| r.get(0))?;
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
