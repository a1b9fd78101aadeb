//! An exchange with an upstream, as data: the body a vendor mode is sent,
//! an answer read (SSE events, a completion), the moment a reply is cut,
//! and the built-in mock's echo text.

pub mod accumulate;
pub mod cut;
pub mod echo;
pub mod embed;
pub mod protocol;
