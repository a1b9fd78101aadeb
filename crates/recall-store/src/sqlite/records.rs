//! Users' long-term memory records (`store::Records`) in SQLite: tables
//! `memory_records` and `memory_users` (migration 6).
//!
//! They are written on a connection of their own, not through the session
//! writer's queue: a change must answer whether its compare-and-set held,
//! and records are written after a turn, off its path. WAL lets this
//! connection and the session writer both write, one transaction at a
//! time (each waits for the other's lock, up to the busy timeout); both
//! take the write lock with their first statement, so neither is refused
//! for a snapshot gone stale. The lock on this connection also orders the
//! `Records` cache's updates with the writes they follow.

use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::Sqlite;
use crate::records::stored::{body, record, to_blob, with_recalled, Held};
use crate::StorageError;
use recall_core::memory::long_term::Record;

impl Sqlite {
    /// Runs `f` on the records connection, under its lock, off the async
    /// runtime. `f` runs to its end even if the caller stops waiting, so
    /// what it does after a commit (updating a cache) is never skipped.
    pub(crate) async fn records<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let conn = std::sync::Arc::clone(&self.records);
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| StorageError::Task(e.to_string()))?
    }
}

/// The user's records, in id order. Only the records connection writes
/// these tables, and it is ours while we read: no transaction needed.
pub(crate) fn load(conn: &Connection, user: &str) -> Result<Held, StorageError> {
    let (version, forgotten_at) = marker(conn, user)?;
    let mut stmt = conn
        .prepare_cached("SELECT body, embedding FROM memory_records WHERE user = ?1 ORDER BY id")?;
    let records = stmt
        .query_map([user], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?
        .map(|row| {
            let (body, blob) = row?;
            record(&body, &blob).map(Arc::new)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Held {
        version,
        forgotten_at,
        records,
    })
}

/// Puts and removes if the user is still at `version`; whether it was.
pub(crate) fn change(
    conn: &mut Connection,
    user: &str,
    version: u64,
    put: &[Record],
    remove: &[String],
) -> Result<bool, StorageError> {
    // Immediate: the write lock before the version is read, so that the
    // check and the writes are one step for any other writer.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if marker(&tx, user)?.0 != version {
        return Ok(false);
    }
    for id in remove {
        tx.prepare_cached("DELETE FROM memory_records WHERE user = ?1 AND id = ?2")?
            .execute([user, id])?;
    }
    for r in put {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO memory_records (user, id, body, embedding)
             VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![user, r.id, body(r)?, to_blob(&r.embedding)])?;
    }
    bump(&tx, user, None)?;
    tx.commit()?;
    Ok(true)
}

/// Removes one record; the new version if it was there.
pub(crate) fn delete(
    conn: &mut Connection,
    user: &str,
    id: &str,
) -> Result<Option<u64>, StorageError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let removed = tx
        .prepare_cached("DELETE FROM memory_records WHERE user = ?1 AND id = ?2")?
        .execute([user, id])?;
    if removed == 0 {
        return Ok(None);
    }
    let version = bump(&tx, user, None)?;
    tx.commit()?;
    Ok(Some(version))
}

/// Removes all the user's records; how many, and the new version.
pub(crate) fn forget(
    conn: &mut Connection,
    user: &str,
    at_ms: i64,
) -> Result<(usize, u64), StorageError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let removed = tx
        .prepare_cached("DELETE FROM memory_records WHERE user = ?1")?
        .execute([user])?;
    let version = bump(&tx, user, Some(at_ms))?;
    tx.commit()?;
    Ok((removed, version))
}

/// Sets `recalled_at` on those of `ids` still stored; the version stays.
pub(crate) fn recalled(
    conn: &mut Connection,
    user: &str,
    ids: &[String],
    at_ms: i64,
) -> Result<(), StorageError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for id in ids {
        let stored: Option<String> = tx
            .prepare_cached("SELECT body FROM memory_records WHERE user = ?1 AND id = ?2")?
            .query_row([user, id], |r| r.get(0))
            .optional()?;
        if let Some(stored) = stored {
            tx.prepare_cached("UPDATE memory_records SET body = ?3 WHERE user = ?1 AND id = ?2")?
                .execute([user, id, &with_recalled(&stored, at_ms)?])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The user's version and when they were last forgotten (0, 0 if never
/// written).
fn marker(conn: &Connection, user: &str) -> Result<(u64, i64), StorageError> {
    let row: Option<(i64, i64)> = conn
        .prepare_cached("SELECT version, forgotten_at FROM memory_users WHERE user = ?1")?
        .query_row([user], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (version, forgotten_at) = row.unwrap_or((0, 0));
    let version = u64::try_from(version)
        .map_err(|_| StorageError::Corrupt(format!("memory version {version} of {user}")))?;
    Ok((version, forgotten_at))
}

/// Moves the user's version by one (and sets `forgotten_at` if given);
/// the new version.
fn bump(conn: &Connection, user: &str, forgotten_at: Option<i64>) -> Result<u64, StorageError> {
    let version: i64 = conn
        .prepare_cached(
            "INSERT INTO memory_users (user, version, forgotten_at)
             VALUES (?1, 1, coalesce(?2, 0))
             ON CONFLICT (user) DO UPDATE SET version = version + 1,
                 forgotten_at = coalesce(?2, forgotten_at)
             RETURNING version",
        )?
        .query_row(params![user, forgotten_at], |r| r.get(0))?;
    u64::try_from(version)
        .map_err(|_| StorageError::Corrupt(format!("memory version {version} of {user}")))
}
