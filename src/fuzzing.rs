//! The fuzz entry points as `tests/suite/fuzz_corpus.rs` replays them: the
//! core's (`recall_core::fuzzing`, what the fuzz targets in `fuzz/` run),
//! and for a refused request also the server's answer to it, which must be
//! buildable.
//!
//! Not an API: hidden from the docs, and it changes with the code it drives.

pub use recall_core::fuzzing::{config_load, responses, sse_accumulator};

/// The core's `request_reconcile`, and the HTTP answer to a body it
/// refuses.
pub fn request_reconcile(data: &[u8]) {
    recall_core::fuzzing::request_reconcile(data);
    if let Err(e) = crate::api::parse_request(data, 2048) {
        let _ = axum::response::IntoResponse::into_response(crate::error::ApiError::from(e));
    }
}
