//! What an upstream's vendor mode decides about the body it is sent.

use crate::config::{InterruptedRendering, Roles, UpstreamConfig, Vendor};
use crate::memory::summary::Summary;

/// What a vendor mode decides, taken from an upstream's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorRules {
    /// Openai: only the fields OpenAI's API accepts. Custom: every field,
    /// with recall's `turn_id`, `timestamp`, `interruptable` and summary.
    pub mode: Vendor,
    pub interruptable: bool,
    pub strip_fields: Vec<String>,
    pub interrupted: InterruptedRendering,
    pub interrupted_marker: String,
    pub roles: Roles,
}

impl VendorRules {
    /// Whether `render::outbound` gives both the same messages (it reads
    /// only these fields).
    pub fn renders_like(&self, other: &VendorRules) -> bool {
        self.mode == other.mode
            && self.interrupted == other.interrupted
            && self.interrupted_marker == other.interrupted_marker
            && self.roles == other.roles
    }

    pub fn from_config(u: &UpstreamConfig) -> Self {
        Self {
            mode: u.vendor,
            interruptable: u.interruptable,
            strip_fields: u.strip_fields.clone(),
            interrupted: u.interrupted,
            interrupted_marker: u.interrupted_marker.clone(),
            roles: u.roles,
        }
    }

    /// Whether the extension fields (`turn_id`, `timestamp`, `metadata`)
    /// go upstream with each message, and so count toward its size.
    pub fn sends_extensions(&self) -> bool {
        match self.mode {
            Vendor::Custom => true,
            Vendor::Openai => false,
        }
    }
}

/// What the session knows about the turn being sent, if there is a session.
#[derive(Debug, Clone, Copy)]
pub struct TurnInfo<'a> {
    pub turn_id: u64,
    /// The session's running summary, which vendor "custom" also gets as
    /// `recall_summary`.
    pub summary: Option<&'a Summary>,
}
