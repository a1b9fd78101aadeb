//! Redis: memory shared by several recall replicas behind any load
//! balancer.
//!
//! Keys, under the configured prefix `P`:
//! - `P:s:{id}`: hash, the session's meta and a `version` that every write
//!   batch bumps;
//! - `P:m:{id}`: hash, message JSON by sequence number;
//! - `P:ids`: sorted set of all ids (score 0, listed in id order);
//! - `P:active`: sorted set of ids by last activity (expiry, eviction);
//! - `P:u:{user}`: set of the ids a user spoke in;
//! - `P:lease:{id}`: which replica holds the session's turn, with expiry;
//! - `P:undelivered`: hash, webhook events kept until delivered, by id;
//! - `P:event-claim:{id}`: which replica is sending a kept event, with expiry;
//! - channel `P:interrupt`: "stop your reply in flight for this id".
//!
//! A replica takes a session's lease before it changes the session, renews
//! it while the turn runs, and gives it up after the turn's record is
//! written (in the same ordered write queue), so one session's turns are
//! serialised across replicas. A replica that dies stops renewing: its
//! lease lapses after `lease_ms`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use futures_util::StreamExt;
use prometheus_client::metrics::histogram::Histogram;
use redis::aio::ConnectionManager;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Batch, Faults, Fences, Listed, Loaded, Meta, Op, StorageError, Ticket};
use crate::config::StorageConfig;
use crate::memory::message::Message;

/// Batches larger than this are split, to bound one transaction's size.
const MAX_BATCH_OPS: usize = 2048;
/// How often a waiting replica tries to take a lease.
const CLAIM_POLL: Duration = Duration::from_millis(10);

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
const SET_IF_STORED: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end return 0";
const BUMP: &str = "if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HINCRBY', KEYS[1], 'version', 1) else return 0 end";

/// Called with a session id when another replica asks this one to stop
/// the reply it has in flight for that session.
pub type OnInterrupt = Box<dyn Fn(&str) + Send + Sync>;

pub struct Redis {
    prefix: String,
    conn: ConnectionManager,
    tx: mpsc::UnboundedSender<Batch>,
    /// The version of each session this replica last read or wrote; a
    /// different version in Redis means another replica changed it.
    known: Arc<DashMap<String, u64>>,
    lease_ms: u64,
    replica: String,
    next_token: AtomicU64,
    on_interrupt: Arc<OnceLock<OnInterrupt>>,
    /// Sessions whose writes failed (see `Fences`).
    pub(crate) fences: Arc<Fences>,
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) faults: Arc<Faults>,
}

/// A lease held by this replica. Dropping it stops the renewal.
/// `Storage::release` gives a session's lease up once earlier writes are
/// done; a session's lease dropped without it (an error or a client that
/// left between the claim and the turn) queues its own release, rather
/// than keep other replicas waiting until it lapses.
#[derive(Debug)]
pub struct Lease {
    pub(super) id: String,
    pub(super) token: String,
    renewal: CancellationToken,
    /// A session's lease: the writer's queue, for the release on drop.
    release_on_drop: Option<mpsc::UnboundedSender<Batch>>,
}

impl Lease {
    /// Whether the lease was found taken by another holder (it had lapsed)
    /// or is no longer renewed.
    pub fn lost(&self) -> bool {
        self.renewal.is_cancelled()
    }

    /// The op that gives the lease up; the drop then queues nothing.
    pub(super) fn release_op(mut self) -> Op {
        self.release_on_drop = None;
        Op::Release {
            id: std::mem::take(&mut self.id),
            token: std::mem::take(&mut self.token),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.cancel();
        if let Some(tx) = self.release_on_drop.take() {
            let ops = vec![Op::Release {
                id: std::mem::take(&mut self.id),
                token: std::mem::take(&mut self.token),
            }];
            // A writer that has stopped has nothing left to release into.
            let _ = tx.send(Batch { ops, done: None });
        }
    }
}

/// How a claim waits when another turn holds the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Not at all.
    No,
    /// Ask the holder to interrupt its reply, then wait for it.
    Interrupt,
    /// Wait for the holder to finish its turn.
    Patiently,
}

impl Redis {
    pub async fn open(config: &StorageConfig, writes: Histogram) -> Result<Self, StorageError> {
        let url = config.url.clone().unwrap_or_default();
        let client = redis::Client::open(url.as_str())?;
        let conn = client.get_connection_manager().await?;
        let prefix = config.key_prefix.clone();
        let known = Arc::new(DashMap::new());
        let (tx, rx) = mpsc::unbounded_channel();
        let fences = Arc::new(Fences::default());
        let faults: Arc<Faults> = Arc::default();
        tokio::spawn(write_loop(
            Writer {
                conn: conn.clone(),
                prefix: prefix.clone(),
                known: Arc::clone(&known),
                writes,
                fences: Arc::clone(&fences),
                faults: Arc::clone(&faults),
            },
            rx,
        ));
        let on_interrupt: Arc<OnceLock<OnInterrupt>> = Arc::new(OnceLock::new());
        tokio::spawn(listen(
            client,
            format!("{prefix}:interrupt"),
            Arc::clone(&on_interrupt),
        ));
        let replica = format!("{:x}", ring_random());
        tracing::info!(%replica, prefix = %prefix, "redis storage open");
        Ok(Self {
            prefix,
            conn,
            tx,
            known,
            lease_ms: config.lease_ms,
            replica,
            next_token: AtomicU64::new(0),
            on_interrupt,
            fences,
            faults,
        })
    }

    pub fn on_interrupt(&self, f: OnInterrupt) {
        let _ = self.on_interrupt.set(f);
    }

    fn key(&self, kind: &str, id: &str) -> String {
        format!("{}:{kind}:{id}", self.prefix)
    }

    pub fn submit(&self, ops: Vec<Op>) -> Ticket {
        let (done, rx) = oneshot::channel();
        if self
            .tx
            .send(Batch {
                ops,
                done: Some(done),
            })
            .is_err()
        {
            tracing::error!("redis writer has stopped; a change was not stored");
        }
        Ticket::pending(rx)
    }

    /// Takes the session's lease. `None` when another turn holds it and
    /// `wait` is `No`, or it was not given up within the lease time.
    pub async fn claim(&self, id: &str, wait: Wait) -> Result<Option<Lease>, StorageError> {
        let key = self.key("lease", id);
        let token = format!(
            "{}:{}",
            self.replica,
            self.next_token.fetch_add(1, Ordering::Relaxed)
        );
        // A lease lapses within lease_ms when its holder stops renewing it;
        // a live holder's turn may take longer, and a patient writer waits
        // for it (up to the upstream's own limits, a few minutes).
        let patience = match wait {
            Wait::Patiently => Duration::from_secs(300),
            _ => Duration::from_millis(self.lease_ms) + Duration::from_secs(1),
        };
        let deadline = tokio::time::Instant::now() + patience;
        let mut conn = self.conn.clone();
        let mut asked_at: Option<tokio::time::Instant> = None;
        loop {
            let taken: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(self.lease_ms)
                .query_async(&mut conn)
                .await?;
            if taken.is_some() {
                let renewal = CancellationToken::new();
                tokio::spawn(renew(
                    conn,
                    key,
                    token.clone(),
                    self.lease_ms,
                    renewal.clone(),
                ));
                return Ok(Some(Lease {
                    id: id.to_owned(),
                    token,
                    renewal,
                    release_on_drop: Some(self.tx.clone()),
                }));
            }
            if wait == Wait::No || tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            // Asked again now and then: the holder may not have had its
            // reply in flight registered yet when the first request came.
            let ask = asked_at.is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
            if wait == Wait::Interrupt && ask {
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(format!("{}:interrupt", self.prefix))
                    .arg(id)
                    .query_async(&mut conn)
                    .await?;
                asked_at = Some(tokio::time::Instant::now());
            }
            tokio::time::sleep(CLAIM_POLL).await;
        }
    }

    /// Whether this replica's copy of the session is what Redis holds.
    pub async fn is_fresh(&self, id: &str) -> Result<bool, StorageError> {
        let Some(known) = self.known.get(id).map(|v| *v) else {
            return Ok(false);
        };
        let mut conn = self.conn.clone();
        let version: Option<u64> = redis::cmd("HGET")
            .arg(self.key("s", id))
            .arg("version")
            .query_async(&mut conn)
            .await?;
        Ok(version == Some(known))
    }

    pub async fn load(&self, id: &str) -> Result<Option<Loaded>, StorageError> {
        let mut conn = self.conn.clone();
        let (meta, messages): (HashMap<String, String>, HashMap<u64, String>) = redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(self.key("s", id))
            .cmd("HGETALL")
            .arg(self.key("m", id))
            .query_async(&mut conn)
            .await?;
        if !meta.contains_key("created_ms") {
            self.known.remove(id);
            return Ok(None);
        }
        let version = field(&meta, "version").unwrap_or(0);
        let meta = parse_meta(&meta)?;
        let mut ordered: Vec<(u64, String)> = messages.into_iter().collect();
        ordered.sort_by_key(|(seq, _)| *seq);
        let messages = ordered
            .into_iter()
            .map(|(_, body)| {
                serde_json::from_str::<Message>(&body)
                    .map_err(|e| StorageError::Corrupt(format!("message of {id}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.known.insert(id.to_owned(), version);
        Ok(Some(Loaded { meta, messages }))
    }

    pub async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
        user: Option<&str>,
    ) -> Result<Vec<Listed>, StorageError> {
        let mut conn = self.conn.clone();
        let ids: Vec<String> = match user {
            Some(user) => {
                let mut ids: Vec<String> = redis::cmd("SMEMBERS")
                    .arg(self.key("u", user))
                    .query_async(&mut conn)
                    .await?;
                ids.sort();
                ids.into_iter()
                    .filter(|id| after.is_none_or(|a| id.as_str() > a))
                    .take(limit)
                    .collect()
            }
            None => {
                let from = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
                redis::cmd("ZRANGEBYLEX")
                    .arg(format!("{}:ids", self.prefix))
                    .arg(from)
                    .arg("+")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .query_async(&mut conn)
                    .await?
            }
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HGETALL").arg(self.key("s", id));
            pipe.cmd("HLEN").arg(self.key("m", id));
        }
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let mut out = Vec::with_capacity(ids.len());
        for (id, pair) in ids.into_iter().zip(replies.chunks(2)) {
            let meta: HashMap<String, String> = redis::from_redis_value_ref(&pair[0])
                .map_err(|e| StorageError::Corrupt(e.to_string()))?;
            if !meta.contains_key("created_ms") {
                continue;
            }
            let count: usize = redis::from_redis_value_ref(&pair[1])
                .map_err(|e| StorageError::Corrupt(e.to_string()))?;
            out.push(Listed {
                id,
                meta: parse_meta(&meta)?,
                message_count: count,
            });
        }
        Ok(out)
    }

    pub async fn kept_events(&self) -> Result<Vec<(String, String)>, StorageError> {
        let mut conn = self.conn.clone();
        let kept: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("{}:undelivered", self.prefix))
            .query_async(&mut conn)
            .await?;
        Ok(kept.into_iter().collect())
    }

    /// One kept event's body, if it is still kept.
    pub async fn kept_event(&self, id: &str) -> Result<Option<String>, StorageError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("HGET")
            .arg(format!("{}:undelivered", self.prefix))
            .arg(id)
            .query_async(&mut conn)
            .await?)
    }

    /// Claims a kept event for sending: a lease on `P:event-claim:{id}`,
    /// renewed while held, so that it lapses within `lease_ms` if this
    /// replica dies mid-delivery. `Err` with the time left on the claim
    /// when another replica holds it.
    pub async fn claim_event(&self, id: &str) -> Result<Result<Lease, Duration>, StorageError> {
        let key = self.key("event-claim", id);
        let token = format!(
            "{}:{}",
            self.replica,
            self.next_token.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = self.conn.clone();
        let (taken, ttl): (Option<String>, i64) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        if taken.is_none() {
            // -2: let go just now; -1 (no expiry, not set by recall): look
            // again as if it were a claim of ours.
            let left = match ttl {
                -1 => self.lease_ms,
                t => t.max(0) as u64,
            };
            return Ok(Err(Duration::from_millis(left)));
        }
        let renewal = CancellationToken::new();
        tokio::spawn(renew(
            conn,
            key,
            token.clone(),
            self.lease_ms,
            renewal.clone(),
        ));
        Ok(Ok(Lease {
            id: id.to_owned(),
            token,
            renewal,
            release_on_drop: None,
        }))
    }

    /// Gives up a kept event's claim, if this replica still holds it.
    pub async fn release_event(&self, lease: Lease) -> Result<(), StorageError> {
        let mut conn = self.conn.clone();
        let _: i64 = redis::Script::new(RELEASE)
            .key(self.key("event-claim", &lease.id))
            .arg(&lease.token)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    pub async fn count(&self) -> Result<usize, StorageError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("ZCARD")
            .arg(format!("{}:active", self.prefix))
            .query_async(&mut conn)
            .await?)
    }

    pub async fn idle(&self, cutoff_ms: i64, limit: usize) -> Result<Vec<String>, StorageError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("ZRANGEBYSCORE")
            .arg(format!("{}:active", self.prefix))
            .arg("-inf")
            .arg(format!("({cutoff_ms}"))
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await?)
    }
}

fn ring_random() -> u64 {
    let mut bytes = [0u8; 8];
    let rng = ring::rand::SystemRandom::new();
    let _ = ring::rand::SecureRandom::fill(&rng, &mut bytes);
    u64::from_le_bytes(bytes)
}

fn field<T: std::str::FromStr>(meta: &HashMap<String, String>, name: &str) -> Option<T> {
    meta.get(name)?.parse().ok()
}

fn parse_meta(meta: &HashMap<String, String>) -> Result<Meta, StorageError> {
    fn json<T: serde::de::DeserializeOwned>(
        meta: &HashMap<String, String>,
        name: &str,
    ) -> Result<T, StorageError> {
        let text = meta.get(name).map_or("[]", String::as_str);
        serde_json::from_str(text).map_err(|e| StorageError::Corrupt(format!("{name}: {e}")))
    }
    Ok(Meta {
        created_ms: field(meta, "created_ms").unwrap_or(0),
        last_active_ms: field(meta, "last_active_ms").unwrap_or(0),
        turn_id: field(meta, "turn_id").unwrap_or(0),
        first_seq: field(meta, "first_seq").unwrap_or(0),
        users: json(meta, "users")?,
        system_messages: json(meta, "system_messages")?,
    })
}

async fn renew(
    mut conn: ConnectionManager,
    key: String,
    token: String,
    lease_ms: u64,
    stop: CancellationToken,
) {
    let every = Duration::from_millis((lease_ms / 3).max(50));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let renewed: Result<i64, _> = redis::Script::new(RENEW)
            .key(&key)
            .arg(&token)
            .arg(lease_ms)
            .invoke_async(&mut conn)
            .await;
        match renewed {
            Ok(1) => {}
            Ok(_) => {
                // Lost: a holder that asks (`Lease::lost`) stops acting on it.
                stop.cancel();
                return;
            }
            Err(e) => tracing::warn!(error = %e, key = %key, "could not renew a session lease"),
        }
    }
}

/// Interrupt requests from other replicas; resubscribes after errors.
async fn listen(client: redis::Client, channel: String, on_interrupt: Arc<OnceLock<OnInterrupt>>) {
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => {
                if let Err(e) = pubsub.subscribe(&channel).await {
                    tracing::warn!(error = %e, "redis subscribe failed");
                } else {
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if let (Ok(id), Some(f)) = (msg.get_payload::<String>(), on_interrupt.get())
                        {
                            f(&id);
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "redis pub/sub unavailable"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the writer task holds.
struct Writer {
    conn: ConnectionManager,
    prefix: String,
    known: Arc<DashMap<String, u64>>,
    writes: Histogram,
    fences: Arc<Fences>,
    faults: Arc<Faults>,
}

/// The writer: each round sends what has queued up as one pipeline, with a
/// MULTI/EXEC per session, and learns the new version of every session it
/// wrote.
async fn write_loop(mut w: Writer, mut rx: mpsc::UnboundedReceiver<Batch>) {
    while let Some(first) = rx.recv().await {
        while w.faults.is_paused() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (batches, ops) = super::gather(first, &mut rx, MAX_BATCH_OPS);
        let started = std::time::Instant::now();
        let results = apply_round(&mut w, &batches).await;
        w.writes.observe(started.elapsed().as_secs_f64());
        let failed = results.iter().filter(|r| r.is_err()).count();
        if failed > 0 {
            tracing::error!(ops, batches = batches.len(), failed, "redis writes failed");
        }
        for (b, r) in batches.iter().zip(&results) {
            w.fences.settled(b, r);
        }
        super::settle(batches, results);
    }
}

/// One transaction of a round: the batches of one session (or one batch
/// that changes no session, a webhook event's), in order.
struct Unit {
    session: Option<String>,
    batches: Vec<usize>,
    /// Where its EXEC's answer is in the pipeline's answers.
    exec_at: usize,
    /// Whether it ends with the session's version bump.
    bumps: bool,
}

/// One round: a MULTI/EXEC per session, all sent in one pipeline. Redis
/// refuses a transaction whole (EXECABORT: out of memory, a bad command),
/// so a session whose transaction fails fails alone; the others are
/// stored. The sets of all sessions (`ids`, `active`, users') are updated
/// in the session's own transaction, so they never name a session whose
/// write failed, and a failed one fails no other session. (Redis Cluster
/// would need them moved out of it, since one MULTI must stay in one slot.)
async fn apply_round(w: &mut Writer, batches: &[Batch]) -> Vec<Result<(), String>> {
    let mut results: Vec<Result<(), String>> = vec![Ok(()); batches.len()];
    if w.faults.round_fails(batches.len()) {
        return vec![Err("injected fault: the write round failed".into()); batches.len()];
    }
    // Batches by session, in the order sessions first appear; each
    // session's batches keep their order.
    let mut units: Vec<Unit> = Vec::new();
    let mut by_session: HashMap<&str, usize> = HashMap::new();
    let mut releases = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        for op in &b.ops {
            if let Op::Release { id, token } = op {
                releases.push((format!("{}:lease:{id}", w.prefix), token.clone()));
            }
        }
        let changes = b
            .ops
            .iter()
            .any(|op| !matches!(op, Op::Release { .. } | Op::Resume { .. }));
        let session = b.session();
        let unit = match session {
            Some(id) => *by_session.entry(id).or_insert_with(|| {
                units.push(Unit {
                    session: Some(id.to_owned()),
                    batches: Vec::new(),
                    exec_at: 0,
                    bumps: false,
                });
                units.len() - 1
            }),
            None if changes => {
                units.push(Unit {
                    session: None,
                    batches: Vec::new(),
                    exec_at: 0,
                    bumps: false,
                });
                units.len() - 1
            }
            None => continue,
        };
        units[unit].batches.push(i);
    }

    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut commands = 0;
    for unit in &mut units {
        // A fenced session's batches are refused up to one that lifts the
        // fence; the rest go in its transaction.
        let mut fenced = unit
            .session
            .as_deref()
            .is_some_and(|id| w.fences.contains(id));
        let mut sent = Vec::new();
        for &i in &unit.batches {
            let b = &batches[i];
            if fenced && !b.lifts_fence() {
                results[i] = w
                    .fences
                    .admits(b)
                    .and(Err("an earlier write failed".into()));
                continue;
            }
            fenced = false;
            sent.push(i);
        }
        unit.batches = sent;
        if unit.batches.is_empty() {
            continue;
        }
        pipe.cmd("MULTI");
        commands += 1;
        let mut changed = false;
        for &i in &unit.batches {
            let b = &batches[i];
            for op in &b.ops {
                match queue(&mut pipe, &w.prefix, op) {
                    Ok(Queued {
                        commands: n,
                        changes,
                    }) => {
                        commands += n;
                        changed |= changes;
                    }
                    Err(e) => {
                        // Not half a batch: the transaction is aborted.
                        tracing::error!(error = %e, "a change could not be encoded");
                        pipe.cmd("HSET").arg(format!("{}:unencodable", w.prefix));
                        commands += 1;
                    }
                }
            }
            if w.faults.batch_fails(b) {
                // A command Redis refuses while queuing: EXEC then aborts
                // the whole transaction, as it does for an out-of-memory.
                pipe.cmd("HSET").arg(format!("{}:injected-fault", w.prefix));
                commands += 1;
            }
        }
        if let (Some(id), true) = (&unit.session, changed) {
            pipe.cmd("EVAL")
                .arg(BUMP)
                .arg(1)
                .arg(format!("{}:s:{id}", w.prefix));
            commands += 1;
            unit.bumps = true;
        }
        pipe.cmd("EXEC");
        unit.exec_at = commands;
        commands += 1;
    }
    // Leases are given up after the writes they covered, whether those
    // were stored or not: the next holder reloads what was.
    for (lease, token) in &releases {
        pipe.cmd("EVAL").arg(RELEASE).arg(1).arg(lease).arg(token);
        commands += 1;
    }
    if commands == 0 {
        return results;
    }
    let answers: Vec<redis::Value> = match pipe.query_async(&mut w.conn).await {
        Ok(a) => a,
        Err(e) => {
            // The connection failed: what Redis did is not known. Every
            // session sent is reloaded from what it holds.
            tracing::error!(error = %e, "redis write failed");
            for unit in &units {
                for &i in &unit.batches {
                    results[i] = Err(format!("redis: {e}"));
                }
            }
            return results;
        }
    };
    for unit in &units {
        if unit.batches.is_empty() {
            continue;
        }
        let outcome = match answers.get(unit.exec_at) {
            Some(redis::Value::Array(items)) => match items.iter().find_map(server_error) {
                Some(e) => Err(e),
                None => Ok(items.last()),
            },
            Some(other) => Err(server_error(other).unwrap_or_else(|| "transaction aborted".into())),
            None => Err("no answer to the transaction".into()),
        };
        match outcome {
            Ok(last) => {
                if let Some(id) = unit.session.as_deref() {
                    learn_version(w, id, batches, unit, last);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, session = ?unit.session, "redis write failed");
                for &i in &unit.batches {
                    results[i] = Err(format!("redis: {e}"));
                }
            }
        }
    }
    results
}

fn server_error(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::ServerError(e) => Some(format!("{e:?}")),
        _ => None,
    }
}

/// After a session's transaction went through: the version it left.
fn learn_version(
    w: &Writer,
    id: &str,
    batches: &[Batch],
    unit: &Unit,
    last: Option<&redis::Value>,
) {
    let deleted = unit
        .batches
        .iter()
        .flat_map(|&i| &batches[i].ops)
        .any(|op| matches!(op, Op::Delete { .. }));
    if deleted {
        w.known.remove(id);
    }
    if !unit.bumps {
        return;
    }
    let version = match last {
        Some(redis::Value::Int(v)) => *v as u64,
        _ => 0,
    };
    // One bump past what this replica knew: nobody else wrote. Anything
    // else: another replica did, and the local copy must be reloaded.
    match w.known.get(id).map(|v| *v) {
        Some(before) if before + 1 == version => {
            w.known.insert(id.to_owned(), version);
        }
        // Created by this replica in this round.
        None if version == 1 => {
            w.known.insert(id.to_owned(), version);
        }
        _ => {
            w.known.remove(id);
        }
    }
}

/// Commands queued for one op, and whether they change the session's data
/// (and so bump its version).
struct Queued {
    commands: usize,
    changes: bool,
}

fn queue(pipe: &mut redis::Pipeline, prefix: &str, op: &Op) -> Result<Queued, StorageError> {
    let key = |kind: &str, id: &str| format!("{prefix}:{kind}:{id}");
    let q = |commands, changes| Ok(Queued { commands, changes });
    match op {
        Op::Save { id, meta } => {
            let users = serde_json::to_string(&meta.users).unwrap_or_else(|_| "[]".into());
            let system =
                serde_json::to_string(&meta.system_messages).unwrap_or_else(|_| "[]".into());
            pipe.cmd("HSET")
                .arg(key("s", id))
                .arg("created_ms")
                .arg(meta.created_ms)
                .arg("last_active_ms")
                .arg(meta.last_active_ms)
                .arg("turn_id")
                .arg(meta.turn_id)
                .arg("first_seq")
                .arg(meta.first_seq)
                .arg("users")
                .arg(users)
                .arg("system_messages")
                .arg(system);
            pipe.cmd("ZADD").arg(format!("{prefix}:ids")).arg(0).arg(id);
            pipe.cmd("ZADD")
                .arg(format!("{prefix}:active"))
                .arg(meta.last_active_ms)
                .arg(id);
            for user in &meta.users {
                pipe.cmd("SADD").arg(key("u", user)).arg(id);
            }
            q(3 + meta.users.len(), true)
        }
        Op::Touch {
            id,
            created_ms,
            last_active_ms,
            turn_id,
            first_seq,
        } => {
            // Every field a load needs, so that the session can be loaded
            // whatever became of its Save; `created_ms` only if missing.
            pipe.cmd("HSETNX")
                .arg(key("s", id))
                .arg("created_ms")
                .arg(*created_ms);
            pipe.cmd("HSET")
                .arg(key("s", id))
                .arg("last_active_ms")
                .arg(*last_active_ms)
                .arg("turn_id")
                .arg(*turn_id)
                .arg("first_seq")
                .arg(*first_seq);
            pipe.cmd("ZADD").arg(format!("{prefix}:ids")).arg(0).arg(id);
            pipe.cmd("ZADD")
                .arg(format!("{prefix}:active"))
                .arg(*last_active_ms)
                .arg(id);
            q(4, true)
        }
        Op::Push { id, seq, message } => {
            let body = to_json(message)?;
            pipe.cmd("HSET").arg(key("m", id)).arg(*seq).arg(body);
            q(1, true)
        }
        Op::Set { id, seq, message } => {
            let body = to_json(message)?;
            pipe.cmd("EVAL")
                .arg(SET_IF_STORED)
                .arg(1)
                .arg(key("m", id))
                .arg(*seq)
                .arg(body);
            q(1, true)
        }
        Op::DropBefore { id, from, seq } => {
            if seq > from {
                pipe.cmd("HDEL")
                    .arg(key("m", id))
                    .arg((*from..*seq).collect::<Vec<u64>>());
                return q(1, true);
            }
            q(0, true)
        }
        Op::Clear { id } => {
            pipe.cmd("DEL").arg(key("m", id));
            q(1, true)
        }
        Op::Delete { id, users } => {
            pipe.cmd("DEL").arg(key("s", id)).arg(key("m", id));
            pipe.cmd("ZREM").arg(format!("{prefix}:ids")).arg(id);
            pipe.cmd("ZREM").arg(format!("{prefix}:active")).arg(id);
            for user in users {
                pipe.cmd("SREM").arg(key("u", user)).arg(id);
            }
            q(3 + users.len(), false)
        }
        // Handled by the round: after the transactions, or by the fences.
        Op::Release { .. } | Op::Resume { .. } => q(0, false),
        Op::KeepEvent { id, body } => {
            pipe.cmd("HSET")
                .arg(format!("{prefix}:undelivered"))
                .arg(id)
                .arg(body);
            q(1, false)
        }
        Op::ForgetEvent { id } => {
            pipe.cmd("HDEL")
                .arg(format!("{prefix}:undelivered"))
                .arg(id);
            q(1, false)
        }
    }
}

fn to_json(message: &Message) -> Result<String, StorageError> {
    serde_json::to_string(message).map_err(|e| StorageError::Corrupt(e.to_string()))
}
