//! Reading sessions and the indexes back. The indexes are spread over
//! buckets (`keys.rs`), so a listing or a scan reads every bucket and
//! merges; an index may name a session that is not stored (see
//! `writer.rs`), which every reader here skips.

use std::collections::HashMap;

use redis::Value;

use super::keys::{bucket, BUCKETS};
use super::{Redis, Stamp};
use crate::{Kept, Listed, Loaded, Meta, StorageError};
use recall_core::memory::message::Message;

impl Redis {
    pub async fn load(&self, id: &str) -> Result<Option<Loaded>, StorageError> {
        let mut conn = self.pool.at(&self.keys.meta(id));
        type Hash<K> = HashMap<K, String>;
        let (meta, messages, mut late): (Hash<String>, Hash<u64>, Hash<u64>) = redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(self.keys.meta(id))
            .cmd("HGETALL")
            .arg(self.keys.messages(id))
            .cmd("HGETALL")
            .arg(self.keys.late(id))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.pool.error_at(&self.keys.meta(id), e))?;
        if !meta.contains_key("created_ms") {
            self.known.remove(id);
            return Ok(None);
        }
        let stamp = Stamp {
            version: field(&meta, "version").unwrap_or(0),
            wid: field(&meta, "wid").unwrap_or(0),
            late: field(&meta, "late").unwrap_or(0),
        };
        let meta = parse_meta(&meta)?;
        let mut ordered: Vec<(u64, String)> = messages.into_iter().collect();
        ordered.sort_by_key(|(seq, _)| *seq);
        let messages = ordered
            .into_iter()
            .map(|(seq, body)| {
                let mut m = serde_json::from_str::<Message>(&body)
                    .map_err(|e| StorageError::Corrupt(format!("message of {id}: {e}")))?;
                if let Some(fields) = late.remove(&seq) {
                    let fields = serde_json::from_str(&fields)
                        .map_err(|e| StorageError::Corrupt(format!("late fields of {id}: {e}")))?;
                    recall_core::memory::interruption::merge_late_fields(&mut m, fields);
                }
                Ok(m)
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        self.known.insert(id.to_owned(), stamp);
        Ok(Some(Loaded {
            meta,
            messages,
            version: stamp.version,
        }))
    }

    /// One command on each bucket; their answers in bucket order.
    async fn each_bucket(
        &self,
        cmd: impl Fn(u32) -> redis::Cmd,
    ) -> Result<Vec<Value>, StorageError> {
        let pipes: Vec<redis::Pipeline> = (0..BUCKETS)
            .map(|n| {
                let mut p = redis::pipe();
                p.add_command(cmd(n));
                p
            })
            .collect();
        let mut out = Vec::with_capacity(pipes.len());
        for answer in self.pool.run(&pipes).await {
            match answer?.pop() {
                Some(Value::ServerError(e)) => {
                    return Err(StorageError::Failed(format!("redis: {e:?}")))
                }
                Some(v) => out.push(v),
                None => return Err(StorageError::Failed("redis: no answer".into())),
            }
        }
        Ok(out)
    }

    pub async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
        user: Option<&str>,
    ) -> Result<Vec<Listed>, StorageError> {
        let mut ids: Vec<String> = match user {
            Some(user) => {
                let mut conn = self.pool.at(&self.keys.user(user));
                redis::cmd("SMEMBERS")
                    .arg(self.keys.user(user))
                    .query_async(&mut conn)
                    .await?
            }
            None => {
                // The first `limit` after `after` of each bucket: the first
                // `limit` of all of them are among these.
                let from = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
                let mut ids = Vec::new();
                for v in self
                    .each_bucket(|n| {
                        let mut c = redis::cmd("ZRANGEBYLEX");
                        c.arg(self.keys.ids(n))
                            .arg(&from)
                            .arg("+")
                            .arg("LIMIT")
                            .arg(0)
                            .arg(limit);
                        c
                    })
                    .await?
                {
                    ids.extend(decode::<Vec<String>>(&v)?);
                }
                ids
            }
        };
        ids.sort();
        ids.dedup();
        ids.retain(|id| after.is_none_or(|a| id.as_str() > a));
        ids.truncate(limit);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let pipes: Vec<redis::Pipeline> = ids
            .iter()
            .map(|id| {
                let mut p = redis::pipe();
                p.cmd("HGETALL").arg(self.keys.meta(id));
                p.cmd("HLEN").arg(self.keys.messages(id));
                p
            })
            .collect();
        let answers = self.pool.run(&pipes).await;
        let mut out = Vec::with_capacity(ids.len());
        for (id, answer) in ids.into_iter().zip(answers) {
            let pair = answer?;
            let (Some(meta), Some(count)) = (pair.first(), pair.get(1)) else {
                return Err(StorageError::Failed("redis: no answer".into()));
            };
            let meta: HashMap<String, String> = decode(meta)?;
            // Named by an index but not stored (or no longer): skipped.
            if !meta.contains_key("created_ms") {
                continue;
            }
            out.push(Listed {
                id,
                meta: parse_meta(&meta)?,
                message_count: decode(count)?,
            });
        }
        Ok(out)
    }

    /// What is kept of `what`: ids and bodies.
    pub async fn kept(&self, what: Kept) -> Result<Vec<(String, String)>, StorageError> {
        let mut out = Vec::new();
        for v in self
            .each_bucket(|n| {
                let mut c = redis::cmd("HGETALL");
                c.arg(self.keys.kept(what, n));
                c
            })
            .await?
        {
            out.extend(decode::<HashMap<String, String>>(&v)?);
        }
        out.sort();
        Ok(out)
    }

    /// A user's carried note, as stored.
    /// The key a user's note is written under (its writes' flush key).
    pub fn note_key(&self, user: &str) -> String {
        self.keys.note(user)
    }

    pub async fn note(&self, user: &str) -> Result<Option<String>, StorageError> {
        let mut conn = self.pool.at(&self.keys.note(user));
        Ok(redis::cmd("GET")
            .arg(self.keys.note(user))
            .query_async(&mut conn)
            .await?)
    }

    /// One kept event's or job's body, if it is still kept.
    pub async fn kept_one(&self, what: Kept, id: &str) -> Result<Option<String>, StorageError> {
        let key = self.keys.kept(what, bucket(id));
        let mut conn = self.pool.at(&key);
        Ok(redis::cmd("HGET")
            .arg(&key)
            .arg(id)
            .query_async(&mut conn)
            .await?)
    }

    pub async fn count(&self) -> Result<usize, StorageError> {
        let mut total = 0;
        for v in self
            .each_bucket(|n| {
                let mut c = redis::cmd("ZCARD");
                c.arg(self.keys.active(n));
                c
            })
            .await?
        {
            total += decode::<usize>(&v)?;
        }
        Ok(total)
    }

    /// Ids last active before `cutoff_ms`, oldest first, at most `limit`.
    /// An id whose session is not stored is dropped from the indexes when
    /// it is that old (a session being created has a recent activity), and
    /// not returned.
    pub async fn idle(&self, cutoff_ms: i64, limit: usize) -> Result<Vec<String>, StorageError> {
        let mut scored: Vec<(i64, String)> = Vec::new();
        for v in self
            .each_bucket(|n| {
                let mut c = redis::cmd("ZRANGEBYSCORE");
                c.arg(self.keys.active(n))
                    .arg("-inf")
                    .arg(format!("({cutoff_ms}"))
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit);
                c
            })
            .await?
        {
            for (id, score) in decode::<Vec<(String, f64)>>(&v)? {
                scored.push((score as i64, id));
            }
        }
        scored.sort();
        scored.truncate(limit);
        let ids: Vec<String> = scored.into_iter().map(|(_, id)| id).collect();
        if ids.is_empty() || cutoff_ms == i64::MAX {
            return Ok(ids);
        }
        let pipes: Vec<redis::Pipeline> = ids
            .iter()
            .map(|id| {
                let mut p = redis::pipe();
                p.cmd("EXISTS").arg(self.keys.meta(id));
                p
            })
            .collect();
        let answers = self.pool.run(&pipes).await;
        let mut stale = Vec::new();
        let mut live = Vec::with_capacity(ids.len());
        for (id, answer) in ids.into_iter().zip(answers) {
            match answer?.first() {
                Some(Value::Int(0)) => stale.push(id),
                _ => live.push(id),
            }
        }
        let drops: Vec<redis::Pipeline> = stale
            .iter()
            .map(|id| {
                let b = bucket(id);
                let mut p = redis::pipe();
                p.cmd("ZREM").arg(self.keys.active(b)).arg(id);
                p.cmd("ZREM").arg(self.keys.ids(b)).arg(id);
                p
            })
            .collect();
        for answer in self.pool.run(&drops).await {
            if let Err(e) = answer {
                tracing::warn!(error = %e, "could not drop a stale id from an index");
            }
        }
        Ok(live)
    }
}

pub(super) fn decode<T: redis::FromRedisValue>(v: &Value) -> Result<T, StorageError> {
    redis::from_redis_value_ref(v).map_err(|e| StorageError::Corrupt(e.to_string()))
}

fn field<T: std::str::FromStr>(meta: &HashMap<String, String>, name: &str) -> Option<T> {
    meta.get(name)?.parse().ok()
}

fn parse_meta(meta: &HashMap<String, String>) -> Result<Meta, StorageError> {
    fn json<T: serde::de::DeserializeOwned>(
        meta: &HashMap<String, String>,
        name: &str,
    ) -> Result<T, StorageError> {
        let empty = if matches!(name, "metadata" | "remembered") {
            "{}"
        } else {
            "[]"
        };
        let text = meta.get(name).map_or(empty, String::as_str);
        serde_json::from_str(text).map_err(|e| StorageError::Corrupt(format!("{name}: {e}")))
    }
    Ok(Meta {
        created_ms: field(meta, "created_ms").unwrap_or(0),
        last_active_ms: field(meta, "last_active_ms").unwrap_or(0),
        turn_id: field(meta, "turn_id").unwrap_or(0),
        first_seq: field(meta, "first_seq").unwrap_or(0),
        users: json(meta, "users")?,
        system_messages: json(meta, "system_messages")?,
        metadata: json(meta, "metadata")?,
        remembered: json(meta, "remembered")?,
    })
}
