//! Why a reply was cut off: the `cause` label of `interruptions_total`.

/// Why a reply was cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A newer request of the same session (barge-in).
    NewRequest,
    /// `POST /v1/sessions/{id}/interrupt`.
    Endpoint,
    /// The client closed the stream.
    ClientGone,
    /// Another replica asked (a barge-in that landed there).
    Replica,
    /// Shutdown's grace period ran out.
    Shutdown,
}

impl Cause {
    pub const ALL: [Cause; 5] = [
        Cause::NewRequest,
        Cause::Endpoint,
        Cause::ClientGone,
        Cause::Replica,
        Cause::Shutdown,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Cause::NewRequest => "new_request",
            Cause::Endpoint => "endpoint",
            Cause::ClientGone => "client_gone",
            Cause::Replica => "replica",
            Cause::Shutdown => "shutdown",
        }
    }
}
