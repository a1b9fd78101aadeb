//! See `recall_core::fuzzing::sse_accumulator` for what this drives and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| recall_core::fuzzing::sse_accumulator(data));
