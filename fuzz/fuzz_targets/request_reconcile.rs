//! See `recall_core::fuzzing::request_reconcile` for what this drives and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| recall_core::fuzzing::request_reconcile(data));
