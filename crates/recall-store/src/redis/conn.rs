//! Connections to a single Redis or a Redis Cluster, and the one way both
//! run several pipelines.
//!
//! A cluster gets a connection per master (a lane), chosen by the slot of
//! the key a command names, so that one node's fault stays with the
//! sessions on it: the cluster client queues every request behind a slot
//! refresh, and a refresh waits on the node that failed, so one shared
//! connection stalled every session while a master was dead or paused.
//! Each lane is a whole cluster client (it follows redirects and failovers
//! by itself); the slot map that picks a lane only needs to be roughly
//! right, and is read again every second and after a failed command.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Arg, Cmd, Pipeline, RedisFuture, Value};

use recall_core::config::RedisTarget;

/// A cluster's slots.
const SLOTS: u16 = 16384;

/// How often a cluster's slot map is read again.
const SLOT_MAP_EVERY: Duration = Duration::from_secs(1);

/// One connection, to a single Redis or (a lane of) a cluster.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where commands go: the single Redis, or a cluster's lanes.
#[derive(Clone)]
pub enum Pool {
    Single(ConnectionManager, String),
    Cluster(Arc<Lanes>),
}

pub struct Lanes {
    client: ClusterClient,
    /// For keyless commands, slots not mapped yet, and the slot map.
    first: ClusterConnection,
    /// Each master's lane, by its address.
    by_node: Mutex<HashMap<String, ClusterConnection>>,
    /// Slot ranges and replicas, as last read.
    topology: RwLock<Topology>,
}

impl Pool {
    pub async fn open(target: &RedisTarget, timeout: Duration) -> Result<Self, redis::RedisError> {
        Ok(match target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let node = client.get_connection_info().addr().to_string();
                let conn = client
                    .get_connection_manager_with_config(
                        redis::aio::ConnectionManagerConfig::new()
                            .set_response_timeout(Some(timeout))
                            .set_connection_timeout(Some(timeout)),
                    )
                    .await?;
                Pool::Single(conn, node)
            }
            RedisTarget::Cluster(nodes) => {
                let client =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .response_timeout(timeout)
                        .connection_timeout(timeout)
                        .build()?;
                let first = client.get_async_connection().await?;
                let lanes = Arc::new(Lanes {
                    client,
                    first,
                    by_node: Mutex::default(),
                    topology: RwLock::default(),
                });
                lanes.refresh().await;
                tokio::spawn(keep_mapped(Arc::downgrade(&lanes)));
                Pool::Cluster(lanes)
            }
        })
    }

    /// The connection for commands on `key` (its slot's master's lane).
    pub fn at(&self, key: &str) -> Conn {
        match self {
            Pool::Single(c, _) => Conn::Single(c.clone()),
            Pool::Cluster(l) => Conn::Cluster(l.lane(slot(key.as_bytes()))),
        }
    }

    /// A connection for commands that name no key.
    pub fn any(&self) -> Conn {
        match self {
            Pool::Single(c, _) => Conn::Single(c.clone()),
            Pool::Cluster(l) => Conn::Cluster(l.first.clone()),
        }
    }

    /// Whether a write to `key`'s master has a replica to wait for, as the
    /// cluster's table last read says: the master has a working replica,
    /// or a failover is under way (a live master without slots), when the
    /// node written to may be the one about to lose its slots. A master
    /// whose replica took over after it died has none, and its writes go
    /// on. `None` for one Redis, or a slot not mapped.
    pub fn has_replica(&self, key: &str) -> Option<bool> {
        match self {
            Pool::Single(..) => None,
            Pool::Cluster(l) => {
                let node = l.node(slot(key.as_bytes()))?;
                let t = l.topology.read().unwrap_or_else(|e| e.into_inner());
                Some(t.in_transition || t.replicas.get(&node).is_some_and(|&n| n > 0))
            }
        }
    }

    /// A failed command on `key` as an error that names its node; the
    /// slot map is read again, in case the slot moved.
    pub fn error_at(&self, key: &str, e: redis::RedisError) -> crate::StorageError {
        self.failed();
        crate::StorageError::Node {
            node: self.node_of(key),
            why: describe(&e),
        }
    }

    /// The node that serves `key`, as last known: for errors and logs.
    pub fn node_of(&self, key: &str) -> String {
        match self {
            Pool::Single(_, node) => node.clone(),
            Pool::Cluster(l) => l
                .node(slot(key.as_bytes()))
                .unwrap_or_else(|| "of an unmapped slot".into()),
        }
    }

    /// The node a pipeline goes to (its first key's), as last known.
    pub fn node_of_pipe(&self, p: &Pipeline) -> String {
        match p.cmd_iter().find_map(first_key) {
            Some(key) => self.node_of(&String::from_utf8_lossy(key)),
            None => self.node_of(""),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Pool::Cluster(_))
    }

    /// After a failed command: the slot map may have moved.
    pub fn failed(&self) {
        if let Pool::Cluster(l) = self {
            let l = Arc::clone(l);
            tokio::spawn(async move { l.refresh().await });
        }
    }

    /// How many replicas one Redis has connected; `None` for a cluster,
    /// whose writes ask per master (`has_replica`).
    pub async fn single_replicas(&self) -> Result<Option<u32>, redis::RedisError> {
        let Pool::Single(c, _) = self else {
            return Ok(None);
        };
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut c.clone())
            .await?;
        Ok(Some(
            info.lines()
                .find_map(|l| l.strip_prefix("connected_slaves:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0),
        ))
    }

    /// Loads a script into every node's cache (a cluster sends `SCRIPT
    /// LOAD` to all its nodes; a node that does not answer is skipped).
    pub async fn load_script(&self, body: &str) -> Result<(), redis::RedisError> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(body);
        load.query_async::<Value>(&mut self.any()).await.map(drop)
    }

    /// Runs each pipeline and returns each one's answers, in order. With
    /// one Redis they go as one pipeline (one round trip, in order); with a
    /// cluster each goes to its own slot's lane, all at once, since a
    /// pipeline there must stay in one slot. Each pipeline's server errors
    /// are answers (`Value::ServerError`), not a failure of the call.
    pub async fn run(&self, pipes: &[Pipeline]) -> Vec<Result<Vec<Value>, redis::RedisError>> {
        if pipes.is_empty() {
            return Vec::new();
        }
        match self {
            Pool::Single(c, _) => {
                let mut all = redis::pipe();
                all.ignore_errors();
                for p in pipes {
                    for cmd in p.cmd_iter() {
                        all.add_command(cmd.clone());
                    }
                }
                let mut c = c.clone();
                match all.query_async::<Vec<Value>>(&mut c).await {
                    Ok(mut answers) => {
                        let mut out = Vec::with_capacity(pipes.len());
                        for p in pipes {
                            let n = p.len().min(answers.len());
                            out.push(Ok(answers.drain(..n).collect()));
                        }
                        out
                    }
                    Err(e) => pipes.iter().map(|_| Err(e.clone())).collect(),
                }
            }
            Pool::Cluster(_) => join_all(pipes.iter().map(|p| self.run_one(p))).await,
        }
    }

    /// One pipeline, on its first key's lane.
    pub async fn run_one(&self, p: &Pipeline) -> Result<Vec<Value>, redis::RedisError> {
        let mut c = match p.cmd_iter().find_map(first_key) {
            Some(key) => match self {
                Pool::Cluster(l) => Conn::Cluster(l.lane(slot(key))),
                Pool::Single(..) => self.any(),
            },
            None => self.any(),
        };
        let mut p = p.clone();
        p.ignore_errors().query_async::<Vec<Value>>(&mut c).await
    }
}

impl Lanes {
    fn lane(&self, slot: u16) -> ClusterConnection {
        let Some(node) = self.node(slot) else {
            return self.first.clone();
        };
        let lanes = self.by_node.lock().unwrap_or_else(|e| e.into_inner());
        lanes
            .get(&node)
            .cloned()
            .unwrap_or_else(|| self.first.clone())
    }

    fn node(&self, slot: u16) -> Option<String> {
        let t = self.topology.read().unwrap_or_else(|e| e.into_inner());
        let map = &t.slots;
        let i = map.partition_point(|(_, last, _)| *last < slot);
        map.get(i)
            .filter(|(first, _, _)| *first <= slot)
            .map(|(_, _, node)| node.clone())
    }

    /// Reads the slot map, and opens a lane for each master that has none.
    async fn refresh(&self) {
        let mut first = self.first.clone();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let read = cmd.query_async::<String>(&mut first);
        let topology = match tokio::time::timeout(SLOT_MAP_EVERY, read).await {
            Ok(Ok(table)) => Topology::parse(&table),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "could not read the cluster's slot map");
                return;
            }
            Err(_) => return,
        };
        if topology.slots.is_empty() {
            return;
        }
        let masters: Vec<String> = topology.replicas.keys().cloned().collect();
        *self.topology.write().unwrap_or_else(|e| e.into_inner()) = topology;
        for node in masters {
            let has = self
                .by_node
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&node);
            if has {
                continue;
            }
            match self.client.get_async_connection().await {
                Ok(c) => {
                    self.by_node
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(node)
                        .or_insert(c);
                }
                Err(e) => tracing::debug!(error = %e, %node, "could not open a lane"),
            }
        }
    }
}

/// Reads the slot map again every second while the pool lives.
async fn keep_mapped(lanes: std::sync::Weak<Lanes>) {
    loop {
        tokio::time::sleep(SLOT_MAP_EVERY).await;
        let Some(l) = lanes.upgrade() else { return };
        l.refresh().await;
    }
}

/// A cluster as `CLUSTER NODES` tells it: which master serves each slot
/// range, and how many working replicas each master has.
#[derive(Debug, Default, PartialEq)]
struct Topology {
    /// Sorted (first, last, master address).
    slots: Vec<(u16, u16, String)>,
    /// Replicas not flagged as failing, by master address (masters that
    /// serve slots only).
    replicas: HashMap<String, u32>,
    /// Whether a live master serves no slots: mid-failover, a master whose
    /// replica took its slots over, about to rejoin as a replica.
    in_transition: bool,
}

impl Topology {
    fn parse(table: &str) -> Self {
        // <id> <ip:port@bus[,hostname]> <flags> <master id> <ping> <pong>
        // <epoch> <link> <slot ranges...>
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .filter(|r: &Vec<&str>| r.len() >= 8)
            .collect();
        let addr = |r: &[&str]| r[1].split(['@', ',']).next().unwrap_or_default().to_owned();
        let mut t = Topology::default();
        for m in rows.iter().filter(|r| r[2].contains("master")) {
            let node = addr(m);
            let mut serves = false;
            for range in &m[8..] {
                if range.starts_with('[') {
                    continue; // a slot being migrated or imported
                }
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) {
                    t.slots.push((lo, hi, node.clone()));
                    serves = true;
                }
            }
            if !serves && !m[2].contains("fail") {
                t.in_transition = true;
            }
            if serves {
                let n = rows
                    .iter()
                    .filter(|r| r[2].contains("slave") && !r[2].contains("fail") && r[3] == m[0])
                    .count() as u32;
                t.replicas.insert(node, n);
            }
        }
        t.slots.sort();
        t
    }
}

/// What a failed command says of its node, after "Redis node X".
pub fn describe(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        format!("could not be reached ({e})")
    } else {
        format!("failed ({e})")
    }
}

/// The slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key.
pub fn slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let len = key[open + 1..].iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &key[open + 1..open + 1 + len])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS
}

/// The first key a command of ours names: the third argument of a script
/// call, else the first.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        Arg::Simple(b) => Some(b),
        _ => None,
    });
    let name = args.next()?;
    if name.eq_ignore_ascii_case(b"EVAL") || name.eq_ignore_ascii_case(b"EVALSHA") {
        args.nth(2)
    } else if [&b"WAIT"[..], b"CLUSTER", b"SCRIPT"]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
    {
        None
    } else {
        args.next()
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // The examples of the Redis Cluster specification.
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        let whole = crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % SLOTS;
        assert_eq!(slot(b"foo{}{bar}"), whole);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn a_scripts_key_is_its_third_argument() {
        let mut eval = redis::cmd("EVAL");
        eval.arg("return 1").arg(1).arg("P:{s}:s");
        assert_eq!(first_key(&eval), Some(&b"P:{s}:s"[..]));
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("P:{b1}:ids").arg(0).arg("s");
        assert_eq!(first_key(&zadd), Some(&b"P:{b1}:ids"[..]));
        assert_eq!(first_key(redis::cmd("WAIT").arg(1).arg(10)), None);
        assert_eq!(
            first_key(redis::cmd("SCRIPT").arg("LOAD").arg("return 1")),
            None
        );
    }

    #[test]
    fn a_topology_maps_slots_and_counts_working_replicas() {
        let table = "a 127.0.0.1:1@11 myself,master - 0 0 1 connected 0-5460 [5461->-b]\n\
                     b 127.0.0.1:2@12,host master - 0 0 2 connected 5461-10922 10923\n\
                     e 127.0.0.1:5@15 master,fail - 0 0 3 disconnected\n\
                     c 127.0.0.1:3@13 slave a 0 0 1 connected\n\
                     d 127.0.0.1:4@14 slave,fail b 0 0 2 connected\n";
        let t = Topology::parse(table);
        assert_eq!(
            t.slots,
            vec![
                (0, 5460, "127.0.0.1:1".to_owned()),
                (5461, 10922, "127.0.0.1:2".to_owned()),
                (10923, 10923, "127.0.0.1:2".to_owned()),
            ]
        );
        // The failed master serves nothing, so it is not counted.
        assert_eq!(t.replicas.len(), 2);
        assert_eq!(t.replicas["127.0.0.1:1"], 1);
        assert_eq!(t.replicas["127.0.0.1:2"], 0);
        assert!(!t.in_transition);
        // Mid-failover: the old master, alive, has lost its slots.
        let t = Topology::parse(&table.replace("master,fail", "master"));
        assert!(t.in_transition);
    }
}
