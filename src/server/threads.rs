//! Serving threads: each runs a tokio runtime with one worker of its own
//! and keeps its own upstream connection pools, so that a request, its
//! relay task and its upstream connection stay on one thread.
//!
//! With one runtime of several workers, work stealing moved a request's
//! tasks between threads, and cross-thread wakeups made each request cost
//! a good deal more CPU (docs/perf-journal.md, item 11). Here only whole connections cross threads, once: the
//! first serving thread accepts them all and hands them out in turn,
//! keeping its own share. One listening socket (not one `SO_REUSEPORT`
//! socket per thread) keeps "address in use" an error: a second recall on
//! the same port must fail, not silently take half the connections.
//!
//! Each runtime is tokio's multi-threaded kind with one worker, which owns
//! its thread: dropping the runtime stops it, and nothing has to keep a
//! thread of ours inside `block_on` until the drains are done.
//!
//! The price, on a machine whose cores the load also needs: a thread that
//! the OS preempts holds up its own connections, where a shared runtime's
//! other worker would have taken them: a longer tail between chunks, for
//! more requests a second at full load (docs/perf-journal.md, item 11).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// A runtime for serving thread `k`: one worker, named after it, that
/// knows its index.
pub fn runtime(k: usize) -> io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(format!("recall-serve-{k}"))
        .on_thread_start(move || crate::proxy::client::set_serving_thread(k))
        .enable_all()
        .build()
}

/// How long a serving runtime waits for the tasks left on it once the
/// process is done with it.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

type Handed = (std::net::TcpStream, SocketAddr);

/// The serving threads beyond the accepting one.
pub struct Pool {
    inboxes: Vec<mpsc::UnboundedSender<Handed>>,
    /// Each thread's result of serving, sent when its connections are done.
    served: Vec<oneshot::Receiver<io::Result<()>>>,
    runtimes: Vec<Runtime>,
}

impl Pool {
    /// Starts `extra` serving threads. Each stops accepting when `stopping`
    /// is cancelled, and keeps running the tasks on it (drains after a
    /// client left, say) until the pool is joined or dropped.
    pub fn start(
        extra: usize,
        router: impl Fn() -> Router,
        addr: SocketAddr,
        stopping: &CancellationToken,
    ) -> io::Result<Self> {
        let mut pool = Self {
            inboxes: Vec::with_capacity(extra),
            served: Vec::with_capacity(extra),
            runtimes: Vec::with_capacity(extra),
        };
        for k in 1..=extra {
            let (inbox, rx) = mpsc::unbounded_channel();
            let (done, served) = oneshot::channel();
            let runtime = runtime(k)?;
            let app = router();
            let stopping = stopping.clone();
            runtime.spawn(async move {
                let result = axum::serve(Handoff { rx, addr }, app)
                    .with_graceful_shutdown(stopping.cancelled_owned())
                    .await;
                let _ = done.send(result);
            });
            pool.inboxes.push(inbox);
            pool.served.push(served);
            pool.runtimes.push(runtime);
        }
        Ok(pool)
    }

    /// The listener for the accepting thread: it hands every connection but
    /// its own share to the pool's threads.
    pub fn dispatch(&mut self, listener: TcpListener) -> Dispatch {
        Dispatch {
            listener,
            inboxes: std::mem::take(&mut self.inboxes),
            next: 0,
        }
    }

    /// Waits until every thread has finished its connections, and returns
    /// the first error among them.
    pub async fn served(&mut self) -> io::Result<()> {
        let mut first = Ok(());
        for served in self.served.drain(..) {
            // A task that ended without a word panicked; its connections
            // are gone either way.
            let result = served
                .await
                .unwrap_or_else(|_| Err(io::Error::other("a serving thread ended unexpectedly")));
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    /// Shuts the runtimes down, giving the tasks left on them a moment.
    pub async fn join(mut self) {
        let runtimes = std::mem::take(&mut self.runtimes);
        let _ = tokio::task::spawn_blocking(move || {
            for rt in runtimes {
                rt.shutdown_timeout(RUNTIME_SHUTDOWN);
            }
        })
        .await;
    }
}

impl Drop for Pool {
    /// Not joined (a test's runtime ended with the server in it): the
    /// runtimes stop without waiting, which is allowed inside a runtime.
    fn drop(&mut self) {
        for rt in self.runtimes.drain(..) {
            rt.shutdown_background();
        }
    }
}

/// The accepting thread's listener: takes every connection, keeps every
/// n-th and passes the others on, in turn.
pub struct Dispatch {
    listener: TcpListener,
    inboxes: Vec<mpsc::UnboundedSender<Handed>>,
    next: usize,
}

impl Dispatch {
    /// The thread the next connection goes to: 0 is this one.
    fn turn(&mut self) -> usize {
        let turn = self.next;
        self.next = (self.next + 1) % (self.inboxes.len() + 1);
        turn
    }
}

impl Listener for Dispatch {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            // axum's own accept: it retries on a failed connection and
            // backs off when out of file descriptors.
            let (tcp, addr) = Listener::accept(&mut self.listener).await;
            // Without TCP_NODELAY, Nagle's algorithm holds small SSE chunks
            // back until the previous one is acknowledged (40 ms with
            // delayed ACKs).
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
            let turn = self.turn();
            if turn == 0 {
                return (tcp, addr);
            }
            let std = match tcp.into_std() {
                Ok(std) => std,
                Err(e) => {
                    tracing::debug!(error = %e, "connection lost while handed over");
                    continue;
                }
            };
            match self.inboxes[turn - 1].send((std, addr)) {
                Ok(()) => {}
                // That thread is gone (it panicked): serve it here.
                Err(mpsc::error::SendError((std, addr))) => match TcpStream::from_std(std) {
                    Ok(tcp) => return (tcp, addr),
                    Err(e) => tracing::debug!(error = %e, "connection lost while taken back"),
                },
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A serving thread's listener: the connections handed to it.
struct Handoff {
    rx: mpsc::UnboundedReceiver<Handed>,
    addr: SocketAddr,
}

impl Listener for Handoff {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let Some((std, addr)) = self.rx.recv().await else {
                // The accepting thread stopped: so does this one, through
                // the graceful shutdown that stopped it.
                return std::future::pending().await;
            };
            match TcpStream::from_std(std) {
                Ok(tcp) => return (tcp, addr),
                Err(e) => tracing::debug!(error = %e, "handed-over connection lost"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::future::IntoFuture;

    fn which_thread() -> Router {
        Router::new().route(
            "/",
            get(|| async { crate::proxy::client::serving_thread().to_string() }),
        )
    }

    #[tokio::test]
    async fn connections_go_round_the_threads_and_are_served_there() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stopping = CancellationToken::new();
        let mut pool = Pool::start(2, which_thread, addr, &stopping).unwrap();
        let dispatch = pool.dispatch(listener);
        let here = tokio::spawn(
            axum::serve(dispatch, which_thread())
                .with_graceful_shutdown(stopping.clone().cancelled_owned())
                .into_future(),
        );
        let mut served = Vec::new();
        for _ in 0..6 {
            // A client of its own: a new connection each time.
            let body = reqwest::Client::new()
                .get(format!("http://{addr}/"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            served.push(body);
        }
        assert_eq!(served, ["0", "1", "2", "0", "1", "2"]);
        stopping.cancel();
        here.await.unwrap().unwrap();
        pool.served().await.unwrap();
        pool.join().await;
    }
}
