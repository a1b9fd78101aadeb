//! The fixed words of recall's summary requests, by which the built-in
//! mock (`proxy::mock::echo`) knows one. A file of their own, with no
//! imports, so that the mock depends on nothing else of memory.

/// Heads the fold's user message.
pub const FOLD_HEADING: &str = "Messages to fold in:";
/// Heads a carry-over request's summary.
pub const CARRY_HEADING: &str = "Summary of the conversation that ended:";
