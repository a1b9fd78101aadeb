//! The fuzz targets' inputs as ordinary tests, so that `cargo test` (and
//! CI, with or without cargo-fuzz) checks them on every change: each seed
//! in `fuzz/corpus/<target>/` and each crasher a fuzz run found, kept in
//! `fuzz/regressions/<target>/`, goes through the same entry point as in
//! `fuzz/fuzz_targets/<target>.rs`.

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("sse_accumulator", recall::fuzzing::sse_accumulator),
    ("request_reconcile", recall::fuzzing::request_reconcile),
    ("config_load", recall::fuzzing::config_load),
    ("responses", recall::fuzzing::responses),
];

fn replay(dir: &str, name: &str, target: Target) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(dir)
        .join(name);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in &files {
        let data = std::fs::read(path).unwrap();
        let outcome = std::panic::catch_unwind(|| target(&data));
        assert!(outcome.is_ok(), "{} failed on {}", name, path.display());
    }
    files.len()
}

#[test]
fn every_seed_and_regression_input_passes() {
    for (name, target) in TARGETS {
        let seeds = replay("corpus", name, *target);
        assert!(seeds > 0, "no seeds for {name}");
        replay("regressions", name, *target);
    }
}

fn nested(open: &str, close: &str, depth: usize) -> String {
    format!("{}{}", open.repeat(depth), close.repeat(depth))
}

/// Inputs too large to keep as files: 100,000 levels of nesting in every
/// kind of input recall parses. Each is refused (or, for a stream, counted
/// as malformed), and none overflows the stack.
#[test]
fn deep_nesting_is_refused_everywhere_without_a_stack_overflow() {
    let deep = nested("[", "]", 100_000);
    recall::fuzzing::request_reconcile(deep.as_bytes());
    recall::fuzzing::request_reconcile(
        format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": {deep}}}]}}"#)
            .as_bytes(),
    );
    recall::fuzzing::sse_accumulator(format!("\x05data: {deep}\n\n").as_bytes());
    recall::fuzzing::sse_accumulator(format!("\x00{deep}").as_bytes());
    let toml_arrays =
        format!("x = {deep}\n[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\n");
    recall::fuzzing::config_load(toml_arrays.as_bytes());
    let toml_tables = format!("x = {}\n", nested("{a = ", "}", 100_000));
    recall::fuzzing::config_load(toml_tables.as_bytes());
    let e = recall::Config::parse(&toml_arrays, Path::new("deep.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("deep.toml"), "{e}");
}
