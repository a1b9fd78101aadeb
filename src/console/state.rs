//! The console's state in the `App`: its sign-in gate and the overview's
//! sampled figures. Apart from its routes (mod.rs), which take the `App`.

use std::sync::Arc;
use std::time::Duration;

use super::{gate, series};

/// The console's state in the `App`.
pub struct Console {
    pub gate: gate::Gate,
    pub series: Arc<series::Series>,
}

impl Console {
    /// Starts sampling the overview's figures (so: inside a runtime).
    pub fn start(app_parts: Parts<'_>) -> Self {
        let series = Arc::new(series::Series::new());
        let clock = app_parts.clock.clone();
        series.spawn(
            Arc::clone(app_parts.metrics),
            Duration::from_secs(app_parts.sample_secs),
            move || clock.now_ms(),
        );
        Self {
            gate: gate::Gate::new(app_parts.admin_token, app_parts.client_keys),
            series,
        }
    }
}

/// What the console is built from.
pub struct Parts<'a> {
    pub admin_token: Option<&'a str>,
    pub client_keys: Option<&'a crate::api::auth::ClientKeys>,
    pub metrics: &'a Arc<crate::metrics::Metrics>,
    pub clock: &'a crate::clock::Clock,
    pub sample_secs: u64,
}
