//! `[console]`: the built-in web console at `/ui`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Serves the console at `/ui`. It asks for the admin token when one
    /// is configured (or a client key, which sees its own sessions).
    pub enabled: bool,
    /// How often the overview page's figures are sampled (an hour of them
    /// is kept in process).
    pub sample_secs: u64,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            sample_secs: 10,
        }
    }
}
