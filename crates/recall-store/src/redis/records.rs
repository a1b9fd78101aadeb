//! Users' long-term memory records (`store::Records`) in Redis: keys
//! `P:{u:<user>}:rec`, `:vec` and `:rver` (`keys.rs`), all under the
//! user's hash tag, so that each write is one script in one slot of a
//! cluster. Scripts rather than MULTI/EXEC because a change must abort on
//! what it reads (the version).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use redis::{Script, Value};

use super::read::decode;
use super::Redis;
use crate::records::stored::{body, record, to_blob, with_recalled, Held};
use crate::StorageError;
use recall_core::memory::long_term::Record;

/// KEYS: rec, vec, rver. ARGV: the version expected, how many ids are
/// removed, those ids, then id, body, embedding of each record put.
/// 1 if done, 0 if the version moved.
static CHANGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if (redis.call('HGET', KEYS[3], 'version') or '0') ~= ARGV[1] then return 0 end
         local n = tonumber(ARGV[2])
         for i = 3, n + 2 do
           redis.call('HDEL', KEYS[1], ARGV[i])
           redis.call('HDEL', KEYS[2], ARGV[i])
         end
         for i = n + 3, #ARGV, 3 do
           redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
           redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
         end
         redis.call('HINCRBY', KEYS[3], 'version', 1)
         return 1",
    )
});

/// KEYS: rec, vec, rver. ARGV: the id. The new version, 0 if not stored.
static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
         redis.call('HDEL', KEYS[2], ARGV[1])
         return redis.call('HINCRBY', KEYS[3], 'version', 1)",
    )
});

/// KEYS: rec, vec, rver. ARGV: when. How many were removed, and the new
/// version. The emptied hashes are deleted, not left behind.
static FORGET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local n = redis.call('HLEN', KEYS[1])
         redis.call('DEL', KEYS[1], KEYS[2])
         local v = redis.call('HINCRBY', KEYS[3], 'version', 1)
         redis.call('HSET', KEYS[3], 'forgotten_at', ARGV[1])
         return {n, v}",
    )
});

/// KEYS: rec. ARGV: id, body as read, body with the new time, of each
/// record; a body changed since it was read is left as it is.
static RECALLED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "for i = 1, #ARGV, 3 do
           if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
             redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
           end
         end
         return 0",
    )
});

impl Redis {
    /// The user's records' version: one small round trip.
    pub(crate) async fn records_version(&self, user: &str) -> Result<u64, StorageError> {
        let mut conn = self.pool.at(&self.keys.records(user));
        let v: Value = redis::cmd("HGET")
            .arg(self.keys.records_version(user))
            .arg("version")
            .query_async(&mut conn)
            .await?;
        number(user, &v)
    }

    /// All the user's records, their version and `forgotten_at`, read at
    /// one moment.
    pub(crate) async fn records_load(&self, user: &str) -> Result<Held, StorageError> {
        let mut conn = self.pool.at(&self.keys.records(user));
        let (bodies, blobs, version, forgotten_at): (Value, Value, Value, Value) = redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(self.keys.records(user))
            .cmd("HGETALL")
            .arg(self.keys.embeddings(user))
            .cmd("HGET")
            .arg(self.keys.records_version(user))
            .arg("version")
            .cmd("HGET")
            .arg(self.keys.records_version(user))
            .arg("forgotten_at")
            .query_async(&mut conn)
            .await?;
        let bodies: HashMap<String, String> = decode(&bodies)?;
        let mut blobs: HashMap<String, Vec<u8>> = decode(&blobs)?;
        let mut records = bodies
            .into_iter()
            .map(|(id, body)| {
                let blob = blobs.remove(&id).ok_or_else(|| {
                    StorageError::Corrupt(format!("memory record {id} of {user}: no embedding"))
                })?;
                record(&body, &blob).map(Arc::new)
            })
            .collect::<Result<Vec<Arc<Record>>, _>>()?;
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Held {
            version: number(user, &version)?,
            forgotten_at: number(user, &forgotten_at)?,
            records,
        })
    }

    /// Puts and removes if the user is still at `version`; whether it was.
    pub(crate) async fn records_change(
        &self,
        user: &str,
        version: u64,
        put: &[Record],
        remove: &[String],
    ) -> Result<bool, StorageError> {
        let mut call = CHANGE.prepare_invoke();
        self.user_keys(&mut call, user);
        call.arg(version).arg(remove.len());
        for id in remove {
            call.arg(id);
        }
        for r in put {
            call.arg(&r.id).arg(body(r)?).arg(to_blob(&r.embedding));
        }
        let mut conn = self.pool.at(&self.keys.records(user));
        let done: i64 = call.invoke_async(&mut conn).await?;
        Ok(done == 1)
    }

    /// Removes one record; the new version if it was there.
    pub(crate) async fn records_delete(
        &self,
        user: &str,
        id: &str,
    ) -> Result<Option<u64>, StorageError> {
        let mut call = DELETE.prepare_invoke();
        self.user_keys(&mut call, user);
        call.arg(id);
        let mut conn = self.pool.at(&self.keys.records(user));
        let version: Value = call.invoke_async(&mut conn).await?;
        Ok(Some(number(user, &version)?).filter(|&v| v > 0))
    }

    /// Removes all the user's records; how many, and the new version.
    pub(crate) async fn records_forget(
        &self,
        user: &str,
        at_ms: i64,
    ) -> Result<(usize, u64), StorageError> {
        let mut call = FORGET.prepare_invoke();
        self.user_keys(&mut call, user);
        call.arg(at_ms);
        let mut conn = self.pool.at(&self.keys.records(user));
        let answer: Value = call.invoke_async(&mut conn).await?;
        decode(&answer)
    }

    /// Sets `recalled_at` on those of `ids` still stored: their bodies are
    /// read, changed here (serde, not Lua's JSON), and written back if no
    /// change came between. The version stays.
    pub(crate) async fn records_recalled(
        &self,
        user: &str,
        ids: &[String],
        at_ms: i64,
    ) -> Result<(), StorageError> {
        let key = self.keys.records(user);
        let mut conn = self.pool.at(&self.keys.records(user));
        let bodies: Value = redis::cmd("HMGET")
            .arg(&key)
            .arg(ids)
            .query_async(&mut conn)
            .await?;
        let bodies: Vec<Option<String>> = decode(&bodies)?;
        let mut call = RECALLED.prepare_invoke();
        call.key(&key);
        let mut any = false;
        for (id, stored) in ids.iter().zip(bodies) {
            if let Some(stored) = stored {
                let new = with_recalled(&stored, at_ms)?;
                call.arg(id).arg(stored).arg(new);
                any = true;
            }
        }
        if any {
            let _: Value = call.invoke_async(&mut conn).await?;
        }
        Ok(())
    }

    /// KEYS of the write scripts, in their order: rec, vec, rver.
    fn user_keys(&self, call: &mut redis::ScriptInvocation<'_>, user: &str) {
        call.key(self.keys.records(user))
            .key(self.keys.embeddings(user))
            .key(self.keys.records_version(user));
    }
}

/// A stored number (a version, a time); 0 when not stored.
fn number<T: redis::FromRedisValue + Default>(user: &str, v: &Value) -> Result<T, StorageError> {
    match v {
        Value::Nil => Ok(T::default()),
        v => decode(v).map_err(|e| StorageError::Corrupt(format!("memory of {user}: {e}"))),
    }
}
