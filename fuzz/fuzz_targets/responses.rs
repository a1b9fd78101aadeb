//! See `recall::fuzzing::responses` for what this drives and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| recall::fuzzing::responses(data));
