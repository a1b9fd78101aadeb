//! One connection type for a single Redis and a Redis Cluster, and the one
//! way both run several pipelines.

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::config::RedisTarget;

/// How long a command may take before it counts as failed. The crate's
/// default (500 ms) is shorter than a loaded Redis takes for a round that
/// carries a long reply's `original` (tens of MB): the round then failed
/// with an unknown outcome (a 503 for a turn that may have been stored,
/// and a reload), though Redis was only slow.
const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub async fn open(target: &RedisTarget) -> Result<Self, redis::RedisError> {
        Ok(match target {
            RedisTarget::Single(url) => Conn::Single(
                redis::Client::open(url.as_str())?
                    .get_connection_manager_with_config(
                        redis::aio::ConnectionManagerConfig::new()
                            .set_response_timeout(Some(RESPONSE_TIMEOUT)),
                    )
                    .await?,
            ),
            RedisTarget::Cluster(nodes) => Conn::Cluster(
                redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                    .response_timeout(RESPONSE_TIMEOUT)
                    .build()?
                    .get_async_connection()
                    .await?,
            ),
        })
    }

    /// Runs each pipeline and returns each one's answers, in order. With
    /// one Redis they go as one pipeline (one round trip, in order); with a
    /// cluster each goes to its own slot's node, all at once, since a
    /// pipeline there must stay in one slot. Each pipeline's server errors
    /// are answers (`Value::ServerError`), not a failure of the call.
    pub async fn run(&self, pipes: &[Pipeline]) -> Vec<Result<Vec<Value>, redis::RedisError>> {
        if pipes.is_empty() {
            return Vec::new();
        }
        match self {
            Conn::Single(c) => {
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
            Conn::Cluster(c) => {
                join_all(pipes.iter().map(|p| {
                    let mut c = c.clone();
                    let mut p = p.clone();
                    async move { p.ignore_errors().query_async::<Vec<Value>>(&mut c).await }
                }))
                .await
            }
        }
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
