//! Redis: memory shared by several recall replicas behind any load
//! balancer, on one Redis or a Redis Cluster.
//!
//! Keys, under the configured prefix `P` (`keys.rs`); `{...}` is a hash
//! tag, so a session's keys are in one slot of a cluster:
//! - `P:{id}:s`: hash, the session's meta, a `version` that every batch
//!   changing its data moves, and `late`, a count of drains' late updates;
//! - `P:{id}:m`: hash, message JSON by sequence number;
//! - `P:{id}:o`: hash, a drain's late fields of a message by sequence
//!   number, merged into it on load;
//! - `P:{id}:lease`: which replica holds the session's turn, with expiry;
//! - `P:{b<n>}:ids`: sorted set of the ids of bucket n (score 0, listed in
//!   id order), one of 16 buckets a session's id hashes to;
//! - `P:{b<n>}:active`: sorted set of the ids of bucket n by last activity
//!   (expiry, eviction);
//! - `P:{b<n>}:undelivered`: hash, webhook events kept until delivered, by
//!   id (bucket of the event's id);
//! - `P:{u:<user>}`: set of the ids a user spoke in;
//! - `P:{u:<user>}:note`: a user's carried note;
//! - `P:{u:<user>}:rec`: hash, a user's memory records (JSON without the
//!   embedding) by id;
//! - `P:{u:<user>}:vec`: hash, those records' embeddings (f32
//!   little-endian) by id;
//! - `P:{u:<user>}:rver`: hash, the `version` every change of the user's
//!   records moves (one script writes all three keys, `records.rs`), and
//!   `forgotten_at`;
//! - `P:{e:<event>}:claim`: which replica is sending a kept event, with
//!   expiry;
//! - channel `P:interrupt`: "stop your reply in flight for this id".
//!
//! A replica takes a session's lease before it changes the session, renews
//! it while the turn runs, and gives it up after the turn's record is
//! written (in the same ordered write queue), so one session's turns are
//! serialised across replicas. A replica that dies stops renewing: its
//! lease lapses after `lease_ms`. A lease that lapses while its holder is
//! still at work (a stall, a partition) fences nothing by itself; the
//! session's version does: every write says which version it expects
//! (`Op::Expect`, checked in `apply.lua`), so the stale holder's record is
//! refused rather than written over the new holder's turns. How the
//! indexes are kept next to the sessions' writes, and what a failure
//! between them leaves, is in `writer.rs`.

mod conn;
mod encode;
mod keys;
mod read;
mod records;
mod writer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use futures_util::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use self::conn::{Conn, Pool};
use self::keys::Keys;
use super::{Batch, Faults, Fences, Op, StorageError, Ticket};
use recall_core::config::{RedisTarget, StorageConfig};

/// How often a waiting replica tries to take a lease.
const CLAIM_POLL: Duration = Duration::from_millis(10);

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

/// What a replica last saw of a session in Redis: its `version`, the id
/// of the write that set it (`wid`, 0 for none), and its count of `late`
/// updates. Any of them moved by another replica means the local copy is
/// stale; the write id tells apart two writes that brought the version to
/// the same number (one of them lost in a failover, `apply.lua`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Stamp {
    pub version: u64,
    pub wid: u64,
    pub late: u64,
}

/// Called with a session id when another replica asks this one to stop
/// the reply it has in flight for that session.
pub type OnInterrupt = Box<dyn Fn(&str) + Send + Sync>;

pub struct Redis {
    keys: Keys,
    pool: Pool,
    tx: mpsc::UnboundedSender<Batch>,
    /// Each session as this replica last read or wrote it; a different
    /// stamp in Redis means another replica changed it.
    known: Arc<DashMap<String, Stamp>>,
    lease_ms: u64,
    replica: String,
    next_token: AtomicU64,
    on_interrupt: Arc<OnceLock<OnInterrupt>>,
    /// The token of each session lease this replica holds, by session id:
    /// an interrupt request names the lease it is for, and one that comes
    /// after that lease was given up (pub/sub is not ordered with the
    /// lease) must not cut a later turn.
    holding: Arc<DashMap<String, String>>,
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
    /// A session's lease: where this replica says it holds it.
    holding: Option<Arc<DashMap<String, String>>>,
}

impl Lease {
    /// Whether the lease was found taken by another holder (it had lapsed)
    /// or is no longer renewed.
    pub fn lost(&self) -> bool {
        self.renewal.is_cancelled()
    }

    /// This replica no longer holds it (for interrupt requests).
    fn let_go(&mut self) {
        if let Some(holding) = self.holding.take() {
            holding.remove_if(&self.id, |_, token| *token == self.token);
        }
    }

    /// The op that gives the lease up; the drop then queues nothing.
    pub(super) fn release_op(mut self) -> Op {
        self.let_go();
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
        self.let_go();
        if let Some(tx) = self.release_on_drop.take() {
            let ops = vec![Op::Release {
                id: std::mem::take(&mut self.id),
                token: std::mem::take(&mut self.token),
            }];
            // A writer that has stopped has nothing left to release into.
            let _ = tx.send(Batch {
                ops,
                done: None,
                after: None,
            });
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
    pub async fn open(
        config: &StorageConfig,
        writes: Histogram,
        not_replicated: Counter,
    ) -> Result<Self, StorageError> {
        let target = config.redis_target().map_err(StorageError::Failed)?;
        let timeout = Duration::from_millis(config.timeout_ms);
        let pool = Pool::open(&target, timeout).await?;
        // The writer's own connections: a `WAIT` holds up every command
        // behind it on its connection, and reads must not queue behind it.
        let write_pool = Pool::open(&target, timeout).await?;
        // Writes name the script by its SHA; a node that lacks it later
        // (restarted, promoted) gets it again from the writer.
        if let Err(e) = write_pool.load_script(encode::APPLY).await {
            tracing::warn!(error = %e, "could not load the write script on every node");
        }
        let min_replicas = match config.min_replicas {
            Some(n) => writer::Replicas::Exactly(n),
            None => match pool.single_replicas().await? {
                Some(n) => writer::Replicas::Exactly(n.min(1)),
                None => writer::Replicas::OneIfAny,
            },
        };
        let keys = Keys::new(&config.key_prefix);
        let known = Arc::new(DashMap::new());
        let (tx, rx) = mpsc::unbounded_channel();
        let fences = Arc::new(Fences::default());
        let faults: Arc<Faults> = Arc::default();
        tokio::spawn(writer::write_loop(
            writer::Writer {
                pool: write_pool,
                keys: keys.clone(),
                known: Arc::clone(&known),
                next_wid: AtomicU64::new(ring_random() | 1),
                min_replicas,
                replica_ack_timeout_ms: config.replica_ack_timeout_ms,
                writes,
                not_replicated,
                fences: Arc::clone(&fences),
                faults: Arc::clone(&faults),
            },
            rx,
        ));
        let on_interrupt: Arc<OnceLock<OnInterrupt>> = Arc::new(OnceLock::new());
        let holding: Arc<DashMap<String, String>> = Arc::default();
        // A cluster's nodes pass a plain PUBLISH on to every other node, so
        // a subscription to any one node hears every replica's requests.
        let nodes = match target {
            RedisTarget::Single(url) => vec![url],
            RedisTarget::Cluster(nodes) => nodes,
        };
        tokio::spawn(listen(
            nodes,
            keys.interrupt_channel(),
            Arc::clone(&on_interrupt),
            Arc::clone(&holding),
        ));
        let replica = format!("{:x}", ring_random());
        tracing::info!(%replica, prefix = %config.key_prefix, cluster = pool.is_cluster(), ?min_replicas, "redis storage open");
        Ok(Self {
            keys,
            pool,
            tx,
            known,
            lease_ms: config.lease_ms,
            replica,
            next_token: AtomicU64::new(0),
            on_interrupt,
            holding,
            fences,
            faults,
        })
    }

    pub fn on_interrupt(&self, f: OnInterrupt) {
        let _ = self.on_interrupt.set(f);
    }

    pub fn submit(&self, ops: Vec<Op>) -> Ticket {
        self.send(ops, None)
    }

    /// Resolves once the writes queued before it for `key` (a session's id,
    /// or a user's note key) are settled, whatever other nodes' writes are
    /// still waiting for.
    pub fn flush_of(&self, key: String) -> Ticket {
        self.send(Vec::new(), Some(key))
    }

    fn send(&self, ops: Vec<Op>, after: Option<String>) -> Ticket {
        let (done, rx) = oneshot::channel();
        if self
            .tx
            .send(Batch {
                ops,
                done: Some(done),
                after,
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
        let key = self.keys.lease(id);
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
        let mut conn = self.pool.at(&key);
        let mut asked_at: Option<tokio::time::Instant> = None;
        loop {
            let taken: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(self.lease_ms)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.pool.error_at(&key, e))?;
            if taken.is_some() {
                let release = Some(self.tx.clone());
                return Ok(Some(self.held(conn, key, id, token, release)));
            }
            if wait == Wait::No || tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            // Asked again now and then: the holder may not have had its
            // reply in flight registered yet when the first request came.
            let ask = asked_at.is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
            if wait == Wait::Interrupt && ask {
                // Names the lease it is for: the request may reach its
                // holder after that turn ended and another began.
                let holder: Option<String> =
                    redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                if let Some(holder) = holder {
                    let _: i64 = redis::cmd("PUBLISH")
                        .arg(self.keys.interrupt_channel())
                        .arg(format!("{id}\n{holder}"))
                        .query_async(&mut conn)
                        .await?;
                }
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
        let mut conn = self.pool.at(&self.keys.meta(id));
        let (version, wid, late): (Option<u64>, Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.keys.meta(id))
            .arg("version")
            .arg("wid")
            .arg("late")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.pool.error_at(&self.keys.meta(id), e))?;
        let now = Stamp {
            version: version.unwrap_or(0),
            wid: wid.unwrap_or(0),
            late: late.unwrap_or(0),
        };
        Ok(version.is_some() && now == known)
    }

    /// Claims a kept event or job: a lease on `P:{e:<id>}:claim`,
    /// renewed while held, so that it lapses within `lease_ms` if this
    /// replica dies while on it. `Err` with the time left on the claim
    /// when another replica holds it.
    pub async fn claim_kept(&self, id: &str) -> Result<Result<Lease, Duration>, StorageError> {
        let key = self.keys.kept_claim(id);
        let token = format!(
            "{}:{}",
            self.replica,
            self.next_token.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = self.pool.at(&key);
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
        Ok(Ok(self.held(conn, key, id, token, None)))
    }

    /// A lease just taken under `key`, renewed until dropped; a session's
    /// lease gets the writer's queue for its release on drop.
    fn held(
        &self,
        conn: Conn,
        key: String,
        id: &str,
        token: String,
        release_on_drop: Option<mpsc::UnboundedSender<Batch>>,
    ) -> Lease {
        let renewal = CancellationToken::new();
        tokio::spawn(renew(
            conn,
            key,
            token.clone(),
            self.lease_ms,
            renewal.clone(),
        ));
        let holding = release_on_drop.as_ref().map(|_| {
            self.holding.insert(id.to_owned(), token.clone());
            Arc::clone(&self.holding)
        });
        Lease {
            id: id.to_owned(),
            token,
            renewal,
            release_on_drop,
            holding,
        }
    }

    /// Gives up a kept event's or job's claim, if this replica still holds it.
    pub async fn release_kept(&self, lease: Lease) -> Result<(), StorageError> {
        let mut conn = self.pool.at(&self.keys.kept_claim(&lease.id));
        let _: i64 = redis::Script::new(RELEASE)
            .key(self.keys.kept_claim(&lease.id))
            .arg(&lease.token)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }
}

fn ring_random() -> u64 {
    let mut bytes = [0u8; 8];
    let rng = ring::rand::SystemRandom::new();
    let _ = ring::rand::SecureRandom::fill(&rng, &mut bytes);
    u64::from_le_bytes(bytes)
}

async fn renew(mut conn: Conn, key: String, token: String, lease_ms: u64, stop: CancellationToken) {
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

/// The session an interrupt request (`<id>\n<lease token>`) asks this
/// replica to cut, if this replica still holds that very lease. A request
/// without a token (an older replica's) is for whoever holds the session.
fn meant_for_us<'a>(asked: &'a str, holding: &DashMap<String, String>) -> Option<&'a str> {
    match asked.split_once('\n') {
        None => Some(asked),
        Some((id, token)) => holding
            .get(id)
            .is_some_and(|held| *held == token)
            .then_some(id),
    }
}

/// Interrupt requests from other replicas; resubscribes after errors, to
/// the next node of a cluster.
async fn listen(
    nodes: Vec<String>,
    channel: String,
    on_interrupt: Arc<OnceLock<OnInterrupt>>,
    holding: Arc<DashMap<String, String>>,
) {
    for url in nodes.iter().cycle() {
        match redis::Client::open(url.as_str()) {
            Ok(client) => match client.get_async_pubsub().await {
                Ok(mut pubsub) => {
                    if let Err(e) = pubsub.subscribe(&channel).await {
                        tracing::warn!(error = %e, "redis subscribe failed");
                    } else {
                        let mut messages = pubsub.on_message();
                        while let Some(msg) = messages.next().await {
                            if let (Ok(asked), Some(f)) =
                                (msg.get_payload::<String>(), on_interrupt.get())
                            {
                                if let Some(id) = meant_for_us(&asked, &holding) {
                                    f(id);
                                }
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "redis pub/sub unavailable"),
            },
            Err(e) => tracing::warn!(error = %e, "redis pub/sub: bad node URL"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod interrupt_tests {
    use super::*;

    #[test]
    fn an_interrupt_request_cuts_only_the_lease_it_names() {
        let holding = DashMap::new();
        holding.insert("s1".to_owned(), "r:7".to_owned());
        assert_eq!(meant_for_us("s1\nr:7", &holding), Some("s1"));
        // Sent for an earlier turn's lease, heard during a later one.
        assert_eq!(meant_for_us("s1\nr:5", &holding), None);
        assert_eq!(meant_for_us("s2\nr:7", &holding), None);
        // An older replica's request names no lease.
        assert_eq!(meant_for_us("s2", &holding), Some("s2"));
    }
}
