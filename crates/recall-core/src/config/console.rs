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
    /// Host names (as a browser puts them in the address bar, without the
    /// port) that may open a console with no token, besides the loopback
    /// ones. A console with a token answers on any.
    pub allowed_hosts: Vec<String>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            sample_secs: 10,
            allowed_hosts: Vec::new(),
        }
    }
}
