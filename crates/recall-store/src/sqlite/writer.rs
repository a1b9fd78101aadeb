//! The writer thread (group commit, a savepoint per batch) and the
//! checkpoint thread beside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::histogram::Histogram;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::mpsc;

use super::super::notes::NOTE_CHANGED;
use super::super::{Batch, Faults, Fences, Op, StorageError};
use recall_core::memory::message::Message;

/// Batches larger than this are split, to bound one transaction's size.
pub(super) const MAX_BATCH_OPS: usize = 4096;

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

/// What the writer and the checkpoint thread tell each other.
#[derive(Default)]
pub(super) struct Signals {
    /// The WAL has grown past its limit and the checkpoint thread has just
    /// copied nearly all of it back.
    pub(super) restart: AtomicBool,
    /// The writer has stopped (the storage was dropped): so does the
    /// checkpoint thread.
    pub(super) stopped: AtomicBool,
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
pub(super) fn checkpoint_loop(conn: Connection, wal: WalLimits, signals: &Signals) {
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

/// What the writer thread shares with the rest.
pub(super) struct Writer {
    pub(super) writes: Histogram,
    pub(super) signals: Arc<Signals>,
    pub(super) fences: Arc<Fences>,
    pub(super) faults: Arc<Faults>,
}

/// The writer thread: take what has queued up, commit it as one
/// transaction, then tell every waiter how its batch went.
pub(super) fn write_loop(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Batch>, w: &Writer) {
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
        let (batches, ops) = super::super::gather(first, &mut rx, MAX_BATCH_OPS);
        let results = apply_round(&mut conn, &batches, w);
        w.writes.observe(started.elapsed().as_secs_f64());
        super::super::settle("sqlite", ops, &w.fences, batches, results);
    }
    w.signals.stopped.store(true, Ordering::Relaxed);
    tracing::debug!("sqlite writer stopped");
}

/// One round: a transaction in which each batch (one session's change)
/// has a savepoint of its own. A batch that fails is rolled back to its
/// savepoint and fails alone; the others commit. A failed commit, or an
/// error after which SQLite rolled the whole transaction back (it may,
/// for a full disk or an I/O error), fails them all.
pub(super) fn apply_round(
    conn: &mut Connection,
    batches: &[Batch],
    w: &Writer,
) -> Vec<crate::Outcome> {
    let all_fail = |e: &dyn std::fmt::Display| {
        vec![Err(format!("the SQLite store failed the write ({e})").into()); batches.len()]
    };
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
        let applied =
            applied.map_err(|e| format!("the SQLite store failed the write ({e})").into());
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
pub(super) fn in_savepoint(
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

pub(super) fn to_json(message: &Message) -> Result<String, StorageError> {
    serde_json::to_string(message).map_err(|e| StorageError::Corrupt(e.to_string()))
}

/// Replies wait on this thread's commits before their end is released, so
/// under load it must not queue behind the threads relaying chunks: ask for
/// a higher scheduling priority (best effort; it needs CAP_SYS_NICE).
pub(super) fn raise_priority() {
    // SAFETY: setpriority only reads its integer arguments; on Linux,
    // PRIO_PROCESS with who = 0 applies to the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    if rc != 0 {
        tracing::debug!("sqlite writer runs at normal priority (no CAP_SYS_NICE)");
    }
}

pub(super) fn apply(tx: &Connection, ops: &[Op]) -> Result<(), StorageError> {
    for op in ops {
        if let Some(k) = op.kept() {
            let table = super::kept_table(k.what);
            match k.body {
                Some(body) => tx
                    .prepare_cached(&format!(
                        "INSERT OR REPLACE INTO {table} (id, body) VALUES (?1, ?2)"
                    ))?
                    .execute([k.id, body])?,
                None => tx
                    .prepare_cached(&format!("DELETE FROM {table} WHERE id = ?1"))?
                    .execute([k.id])?,
            };
            continue;
        }
        match op {
            Op::Save { id, meta } => {
                let users = serde_json::to_string(&meta.users).unwrap_or_else(|_| "[]".into());
                let system =
                    serde_json::to_string(&meta.system_messages).unwrap_or_else(|_| "[]".into());
                let metadata =
                    serde_json::to_string(&meta.metadata).unwrap_or_else(|_| "{}".into());
                let remembered =
                    serde_json::to_string(&meta.remembered).unwrap_or_else(|_| "{}".into());
                tx.prepare_cached(
                    "INSERT INTO sessions
                         (id, created_ms, users, system_messages, metadata, remembered)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (id) DO UPDATE SET users = ?3, system_messages = ?4,
                         metadata = ?5, remembered = ?6",
                )?
                .execute(params![
                    id,
                    meta.created_ms,
                    users,
                    system,
                    metadata,
                    remembered
                ])?;
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
            // One process per database: the message here is the newest.
            Op::Set { id, seq, message } | Op::SetLate { id, seq, message } => {
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
            // One process owns the file: no other writer to expect.
            Op::Release { .. } | Op::Resume { .. } | Op::Expect { .. } => {}
            // Kept and forgotten above.
            Op::KeepEvent { .. }
            | Op::ForgetEvent { .. }
            | Op::KeepJob { .. }
            | Op::ForgetJob { .. } => {}
            Op::SaveNote { user, body, expect } => {
                if let Some(expect) = expect {
                    let now: Option<String> = tx
                        .prepare_cached("SELECT body FROM user_notes WHERE user = ?1")?
                        .query_row([user], |r| r.get(0))
                        .optional()?;
                    if now.as_deref().unwrap_or_default() != expect {
                        return Err(StorageError::Failed(NOTE_CHANGED.into()));
                    }
                }
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO user_notes (user, body) VALUES (?1, ?2)",
                )?
                .execute([user, body])?;
            }
        }
    }
    Ok(())
}
