//! The fixed words of recall's extraction requests, by which the built-in
//! mock (`proxy::mock`) knows one. A file of their own, with no imports,
//! so that the mock depends on nothing else of memory.

/// Heads the extraction request's last (user) message; the conversation
/// follows, a line per message: `user: ...` or `assistant: ...`.
pub const EXTRACT_HEADING: &str = "Conversation to extract facts from:";
