//! Serving: the router (the API's and the console's routes over the
//! `App`) and the server's life, from the first accepted connection to the
//! last flush at shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Cause;
use crate::server::app::App;
use crate::server::threads::Pool;

/// The router. Every request passes through `api::observe` (request id,
/// span, log line, metrics) once it is routed, so that it knows the route.
pub fn router(app: Arc<App>) -> Router {
    let console = match app.console {
        Some(_) => crate::console::routes(&app),
        None => Router::new(),
    };
    crate::api::routes(&app, console).with_state(app)
}

/// Serves until `shutdown` resolves, on `[server] worker_threads` threads:
/// this runtime's, which accepts, and one runtime per further thread
/// (`threads`).
/// Then: stop accepting, let replies in flight finish for up to
/// `shutdown_grace_secs`, record the rest as interrupted, hand memory that
/// would be lost to the webhook, flush storage and the webhook queue.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = CancellationToken::new();
    let mut pool = Pool::start(
        app.config.server.serving_threads() - 1,
        || router(Arc::clone(&app)),
        listener.local_addr()?,
        &stopping,
    )?;
    super::lifecycle::resume_carry_overs(&app);
    let sweeper = tokio::spawn(super::lifecycle::sweeper(
        Arc::clone(&app),
        Arc::clone(&app.sweep_now),
    ));
    let graceful = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            stopping.cancel();
        }
    };
    let enforcer = {
        let app = Arc::clone(&app);
        let stopping = stopping.clone();
        tokio::spawn(async move {
            stopping.cancelled().await;
            let grace = Duration::from_secs(app.config.server.shutdown_grace_secs);
            tracing::info!(?grace, "shutting down: finishing replies in flight");
            tokio::time::sleep(grace).await;
            let cut = app.interrupt_all();
            tracing::warn!(
                replies = cut,
                "shutdown grace over: replies in flight recorded as interrupted"
            );
        })
    };
    let here = axum::serve(pool.dispatch(listener), router(Arc::clone(&app)))
        .with_graceful_shutdown(graceful)
        .await;
    let elsewhere = pool.served().await;
    // An interrupt_all already under way finishes (and queues its records)
    // before the final flush.
    enforcer.abort();
    let _ = enforcer.await;
    sweeper.abort();
    app.wind_down().await;
    pool.join().await;
    here.and(elsewhere)
}

impl App {
    /// Cuts off every reply in flight, recording each as interrupted.
    pub fn interrupt_all(&self) -> usize {
        self.sessions
            .all()
            .iter()
            .filter(|s| s.cut_in_flight(&self.policy, Cause::Shutdown))
            .count()
    }

    /// The last steps of a shutdown: end sessions that would be lost, then
    /// make storage durable and give the webhook a last chance.
    pub async fn wind_down(&self) {
        super::lifecycle::end_all(self).await;
        if let Err(e) = self.policy.storage.flush().await {
            tracing::error!(error = %e, "storage flush at shutdown failed");
        }
        self.notifier.drain(WEBHOOK_DRAIN).await;
        tracing::info!("shut down cleanly");
    }
}

/// How long a shutdown waits for webhook deliveries still under way.
const WEBHOOK_DRAIN: Duration = Duration::from_secs(10);
