//! The application: the state every handler shares, and how it is built.
//! The routes over it and serving are `serve.rs`.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::api::auth::{Access, ClientKeys};
use crate::config::Config;
use crate::console::state::{Console, Parts as ConsoleParts};
use crate::error::{ApiError, RequestError};
use crate::long_term::{LongTerm, Parts};
use crate::memory::message::{Message, Role};
use crate::memory::session::{Policy, Store};
use crate::metrics::{Cause, Metrics};
use crate::models::{EmbeddingModel, UpstreamChat, UpstreamEmbedding};
use crate::proxy::cache::AnswerCache;
use crate::proxy::gate::{Acquire, Gate, Place};
use crate::proxy::upstream::{BuildError, Upstreams};
use crate::store::{Notes, Records, Storage};
use crate::summaries::Summarizer;
use crate::webhook::{LogOnly, Notifier, Webhook};

pub struct App {
    pub config: Config,
    pub sessions: Store,
    pub upstreams: Upstreams,
    pub metrics: Arc<Metrics>,
    pub policy: Arc<Policy>,
    /// `policy` for a turn that records nothing (the Responses API's
    /// `store: false`): no storage, no webhook events.
    pub unstored: Arc<Policy>,
    pub notifier: Arc<dyn Notifier>,
    pub cache: Option<AnswerCache>,
    /// The bearer token the session API requires, if one is configured.
    pub admin_token: Option<String>,
    /// The client keys chat requests require, if configured (`auth`).
    pub client_keys: Option<ClientKeys>,
    /// One slot per upstream call in flight, drains included
    /// (`max_concurrent_upstream`).
    pub upstream_slots: Option<Arc<Gate>>,
    /// Wakes the sweeper early, when a new session goes over `max_sessions`.
    pub sweep_now: Arc<Notify>,
    /// The configured `[[system_messages]]`, ready to send.
    pub instructions: Vec<Message>,
    /// The summary model's jobs, with `[memory] summarize` or `carry_over`.
    pub summarizer: Option<Arc<Summarizer>>,
    /// Users' carried notes.
    pub notes: Arc<Notes>,
    /// Users' long-term records (kept whether `[long_term]` is on or not,
    /// so that a user's memory can be read and deleted either way).
    pub records: Arc<Records>,
    /// Long-term memory's models and jobs, with `[long_term] enabled`.
    pub long_term: Option<Arc<LongTerm>>,
    /// The web console, with `[console] enabled`.
    pub console: Option<Console>,
}

/// `model` as its upstream serves recall's own calls, with that
/// upstream's `structured_output`.
fn chat_model(
    config: &Config,
    upstreams: &Upstreams,
    model: &str,
    metrics: &Arc<Metrics>,
) -> Option<UpstreamChat> {
    // Built from the configs in their order: the first that serves the
    // model is `route`'s.
    let (upstream, c) = upstreams
        .iter()
        .zip(&config.upstreams)
        .find(|(u, _)| u.serves(model))?;
    Some(UpstreamChat::new(
        Arc::clone(upstream),
        model.to_owned(),
        c.structured_output,
        Arc::clone(metrics),
    ))
}

/// Long-term memory, when enabled (validation made sure both its models
/// are routed, or the embedding model is local).
async fn long_term(
    config: &Config,
    upstreams: &Upstreams,
    policy: &Policy,
    records: &Arc<Records>,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<LongTerm>>, BuildError> {
    let c = &config.long_term;
    if !c.enabled {
        return Ok(None);
    }
    let Some(embed) = &c.embedding_model else {
        return Ok(None);
    };
    let chat = match &c.extract_model {
        Some(extract) => match chat_model(config, upstreams, extract, metrics) {
            Some(chat) => Some(Arc::new(chat) as Arc<dyn crate::models::ChatModel>),
            None => return Ok(None),
        },
        None => None,
    };
    let embedder: Arc<dyn EmbeddingModel> = match c.local_embedder() {
        Some(dir) => local_embedder(embed, dir).await?,
        None => match upstreams.route(embed) {
            Some(upstream) => Arc::new(UpstreamEmbedding {
                upstream: Arc::clone(upstream),
                model: embed.clone(),
                encoding: c.embedding_encoding,
            }),
            None => return Ok(None),
        },
    };
    let parts = Parts {
        chat,
        embedder,
        records: Arc::clone(records),
        storage: Arc::clone(&policy.storage),
        clock: policy.clock.clone(),
        metrics: Arc::clone(metrics),
    };
    Ok(Some(Arc::new(LongTerm::new(c.clone(), parts))))
}

const EMBEDDING_MODEL_KEY: &str = "long_term.embedding_model";

/// The `local:` embedding model, loaded before the server answers.
#[cfg(feature = "local-embedder")]
async fn local_embedder(
    name: &str,
    dir: &std::path::Path,
) -> Result<Arc<dyn EmbeddingModel>, BuildError> {
    match crate::models::local::LocalEmbedding::start(name, dir).await {
        Ok(model) => Ok(Arc::new(model)),
        Err(e) => Err(BuildError::new(EMBEDDING_MODEL_KEY, e)),
    }
}

/// Validation refuses a `local:` model in a build without one; this says
/// so again rather than start without long-term memory.
#[cfg(not(feature = "local-embedder"))]
async fn local_embedder(
    name: &str,
    _dir: &std::path::Path,
) -> Result<Arc<dyn EmbeddingModel>, BuildError> {
    Err(BuildError::new(
        EMBEDDING_MODEL_KEY,
        format!("({name:?}) needs a recall built with the `local-embedder` feature"),
    ))
}

impl App {
    /// Builds the application; starts the webhook's delivery task, so it
    /// must be called inside a tokio runtime.
    pub async fn new(config: Config) -> Result<Arc<Self>, BuildError> {
        let metrics = Arc::new(Metrics::default());
        let storage = Storage::open(&config.storage, &metrics)
            .await
            .map_err(|e| BuildError::new("storage", e))?;
        let storage: Arc<Storage> = storage;
        let upstreams =
            Upstreams::start(&config.upstreams, config.server.serving_threads()).await?;
        metrics.preset_upstreams(config.upstreams.iter().map(|u| u.name.as_str()));
        let instructions = config
            .system_messages
            .iter()
            .map(|s| {
                // The config's roles were checked when it was loaded.
                let role = Role::parse(&s.role).unwrap_or(Role::System);
                let mut m = Message::new(role, s.content.as_str());
                m.set_name(s.name.clone());
                m
            })
            .collect();
        let notifier: Arc<dyn Notifier> = match &config.webhook.url {
            Some(url) => Webhook::start(
                &config.webhook,
                url,
                Arc::clone(&storage),
                Arc::clone(&metrics),
            )
            .map_err(|e| BuildError::new("webhook", e))?,
            None => Arc::new(LogOnly),
        };
        let policy = Arc::new(Policy {
            history: config.history.clone(),
            memory: config.memory.clone(),
            long_term: config.long_term.clone(),
            on_new_request: config.interruption.on_new_request,
            barge_in_after_close_ms: config.interruption.barge_in_after_close_ms,
            metrics: Arc::clone(&metrics),
            notifier: Arc::clone(&notifier),
            storage,
            clock: crate::clock::Clock::System,
        });
        let unstored = Arc::new(Policy {
            history: config.history.clone(),
            memory: config.memory.clone(),
            long_term: config.long_term.clone(),
            on_new_request: config.interruption.on_new_request,
            barge_in_after_close_ms: config.interruption.barge_in_after_close_ms,
            metrics: Arc::clone(&metrics),
            notifier: Arc::new(LogOnly),
            storage: Arc::new(Storage::Memory),
            clock: crate::clock::Clock::System,
        });
        let admin_token = config
            .admin
            .token_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|t| !t.is_empty());
        let client_keys = ClientKeys::load(&config.auth).map_err(|e| BuildError::new("auth", e))?;
        if admin_token.is_none() && client_keys.is_none() {
            tracing::warn!("the /v1/sessions API is open: set [admin] token_env to protect it");
        }
        let summarizer = config
            .memory
            .summary_model
            .as_ref()
            .filter(|_| config.memory.uses_model())
            .and_then(|model| {
                let model = Arc::new(chat_model(&config, &upstreams, model, &metrics)?);
                Some(Arc::new(Summarizer::new(
                    config.memory.clone(),
                    model,
                    Arc::clone(&metrics),
                )))
            });
        let records: Arc<Records> = Arc::default();
        let long_term = long_term(&config, &upstreams, &policy, &records, &metrics).await?;
        let limit = config.server.max_concurrent_upstream;
        let upstream_slots = (limit > 0).then(|| Gate::new(limit));
        let console = config.console.enabled.then(|| {
            Console::start(ConsoleParts {
                admin_token: admin_token.as_deref(),
                client_keys: client_keys.as_ref(),
                metrics: &metrics,
                clock: &policy.clock,
                sample_secs: config.console.sample_secs,
            })
        });
        let app = Arc::new(Self {
            cache: AnswerCache::new(&config.cache),
            config,
            sessions: Store::default(),
            upstreams,
            metrics,
            policy,
            unstored,
            notifier,
            admin_token,
            client_keys,
            upstream_slots,
            sweep_now: Arc::new(Notify::new()),
            instructions,
            summarizer,
            notes: Arc::default(),
            records,
            long_term,
            console,
        });
        // Another replica asks for this one's reply in flight to stop.
        let weak = Arc::downgrade(&app);
        app.policy.storage.on_interrupt(Box::new(move |id| {
            if let Some(app) = weak.upgrade() {
                if let Some(session) = app.sessions.get(id) {
                    session.cut_in_flight(&app.policy, Cause::Replica);
                }
            }
        }));
        Ok(app)
    }
}

impl App {
    /// Whose sessions a chat request reaches: without client keys, all;
    /// with them, its key's own, and no key is a 401.
    pub fn client_access(&self, headers: &axum::http::HeaderMap) -> Result<Access, ApiError> {
        match &self.client_keys {
            None => Ok(Access::All),
            Some(keys) => keys
                .tenant(headers)
                .map(Access::Tenant)
                .ok_or_else(|| RequestError::NoClientKey.into()),
        }
    }

    /// A slot for one upstream call, held until its exchange ends (drain
    /// included): a free one, or one a drain gives up, or else the one of
    /// the reply this request will cut (`cutting`: its session's reply in
    /// flight, looked up only then); none of these is a 503 before
    /// anything is stored. `None` without a limit. The slot may still be
    /// on its way: it is awaited after the cut (`relay`).
    pub fn upstream_slot(
        &self,
        cutting: impl FnOnce() -> Option<Arc<Place>>,
    ) -> Result<Option<Acquire>, ApiError> {
        let Some(gate) = &self.upstream_slots else {
            return Ok(None);
        };
        gate.admit(None)
            .or_else(|| gate.admit(Some(&cutting()?)))
            .map(Some)
            .ok_or(ApiError::Overloaded {
                limit: gate.limit(),
            })
    }

    /// A new session was created: past `max_sessions`, wake the sweeper
    /// rather than wait for its next round.
    pub fn session_created(&self) {
        if self.sessions.len() > self.config.session.max_sessions {
            self.sweep_now.notify_one();
        }
    }
}
