//! The config's parsing and checks, key by key.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("test.toml"))
}

const UPSTREAM: &str = "[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\n";

#[test]
fn minimal_config_gets_defaults() {
    let c = parse(UPSTREAM).unwrap();
    assert_eq!(c.history.window_messages, 20);
    assert_eq!(c.history.max_messages, 1000);
    assert_eq!(c.history.window_tokens, 0);
    assert_eq!(c.session.header, "x-session-id");
    assert_eq!(c.upstreams[0].vendor, Vendor::Openai);
    assert_eq!(c.upstreams[0].models, vec!["*"]);
    assert!(c.upstreams[0].interruptable);
}

#[test]
fn every_config_in_the_config_directory_is_valid() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config"));
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let c = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            // What `recall check` prints parses back to the same config.
            let again = Config::parse(&c.masked_toml(), &path).unwrap();
            assert_eq!(again.upstreams.len(), c.upstreams.len());
            seen += 1;
        }
    }
    assert!(seen >= 1);
}

#[test]
fn errors_name_the_key_and_file() {
    let e = parse(&format!("[history]\nwindow_mesages = 3\n{UPSTREAM}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("window_mesages") && e.contains("test.toml"),
        "{e}"
    );

    let e = parse("[history]\nwindow_messages = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("window_messages"), "{e}");

    let e = parse("").unwrap_err().to_string();
    assert!(e.contains("upstreams"), "{e}");

    let e = parse("[[upstreams]]\nname = \"a\"\nbase_url = \"not a url\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("upstreams[0].base_url"), "{e}");

    let e = parse(&format!(
        "[history]\nwindow_messages = 50\nmax_messages = 10\n{UPSTREAM}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("history.window_messages"), "{e}");

    let e = parse(&format!("[server]\nlisten = \"nowhere\"\n{UPSTREAM}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("server.listen"), "{e}");

    let e = parse(&format!("[server]\nworker_threads = 100000\n{UPSTREAM}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("server.worker_threads"), "{e}");
    let one = parse(&format!("[server]\nworker_threads = 1\n{UPSTREAM}")).unwrap();
    assert_eq!(one.server.worker_threads, 1);
}

#[test]
fn a_vendor_mode_recall_does_not_know_is_an_error_not_openai() {
    let upstream = |vendor: &str| {
        format!("[[upstreams]]\nname = \"a\"\nbase_url = \"http://x/v1\"\nvendor = \"{vendor}\"\n")
    };
    let e = parse(&upstream("Custom")).unwrap_err().to_string();
    assert!(e.contains("vendor") && e.contains("Custom"), "{e}");
    assert!(e.contains("openai") && e.contains("custom"), "{e}");
    assert!(parse(&upstream("custom")).unwrap().upstreams[0].is_custom());
    assert!(!parse(&upstream("openai")).unwrap().upstreams[0].is_custom());
}

#[test]
fn a_mock_upstream_is_checked_like_any_other() {
    let mock = |extra: &str| {
        parse(&format!(
            "[[upstreams]]\nname = \"m\"\nbase_url = \"mock://echo\"\n{extra}"
        ))
    };
    let c = mock("mock_chunk_delay_ms = 0\nmock_words_per_chunk = 3\n").unwrap();
    assert_eq!(c.upstreams[0].mock_words_per_chunk, Some(3));
    // `recall check` shows the pace in effect, defaults included.
    let shown = mock("").unwrap().masked_toml();
    assert!(shown.contains("mock_chunk_delay_ms = 40"), "{shown}");
    assert!(shown.contains("mock_words_per_chunk = 1"), "{shown}");

    let e = parse("[[upstreams]]\nname = \"m\"\nbase_url = \"mock://parrot\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("upstreams[0].base_url")
            && e.contains("mock://parrot")
            && e.contains("mock://echo")
            && e.contains("test.toml"),
        "{e}"
    );
    let e = mock("mock_words_per_chunk = 0\n").unwrap_err().to_string();
    assert!(e.contains("upstreams[0].mock_words_per_chunk"), "{e}");
    let e = mock("read_timeout_secs = 1\nmock_chunk_delay_ms = 1000\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("upstreams[0].mock_chunk_delay_ms"), "{e}");
    let e = parse(&format!("{UPSTREAM}mock_chunk_delay_ms = 5\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("upstreams[0].mock_chunk_delay_ms") && e.contains("mock://"),
        "{e}"
    );
}

#[test]
fn window_tokens_is_checked_and_shown_by_check() {
    let c = parse(&format!("[history]\nwindow_tokens = 8000\n{UPSTREAM}")).unwrap();
    assert_eq!(c.history.window_tokens, 8000);
    assert!(c.masked_toml().contains("window_tokens = 8000"));
    let e = parse(&format!(
        "[history]\nwindow_tokens = 1000000000\n{UPSTREAM}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("history.window_tokens"), "{e}");
    let e = parse(&format!("[history]\nwindow_tokens = -1\n{UPSTREAM}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("window_tokens"), "{e}");
}

#[test]
fn barge_in_after_close_is_bounded() {
    let c = parse(UPSTREAM).unwrap();
    assert_eq!(c.interruption.barge_in_after_close_ms, 10_000);
    let c = parse(&format!(
        "[interruption]\nbarge_in_after_close_ms = 0\n{UPSTREAM}"
    ))
    .unwrap();
    assert_eq!(c.interruption.barge_in_after_close_ms, 0);
    let e = parse(&format!(
        "[interruption]\nbarge_in_after_close_ms = 60001\n{UPSTREAM}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("interruption.barge_in_after_close_ms"), "{e}");
}

#[test]
fn unlimited_window_needs_unlimited_max() {
    assert!(parse(&format!(
        "[history]\nwindow_messages = 0\nmax_messages = 0\n{UPSTREAM}"
    ))
    .is_ok());
    assert!(parse(&format!("[history]\nwindow_messages = 0\n{UPSTREAM}")).is_err());
}

#[test]
fn redis_url_names_one_redis_or_a_clusters_nodes() {
    let with = |url: &str, extra: &str| {
        parse(&format!(
            "{UPSTREAM}[storage]\nbackend = \"redis\"\nurl = \"{url}\"\n{extra}"
        ))
    };
    let single = with("redis://127.0.0.1:6379/0", "").unwrap();
    assert_eq!(
        single.storage.redis_target(),
        Ok(RedisTarget::Single("redis://127.0.0.1:6379/0".into()))
    );
    let cluster = with("redis+cluster://u:pw@10.0.0.1:7000,node-2:7001", "").unwrap();
    assert_eq!(
        cluster.storage.redis_target(),
        Ok(RedisTarget::Cluster(vec![
            "redis://u:pw@10.0.0.1:7000".into(),
            "redis://u:pw@node-2:7001".into()
        ]))
    );
    for bad in [
        "http://x:1",
        "redis+cluster://",
        "redis+cluster://a:1,,b:2",
        "redis+cluster://a:notaport",
        "redis+cluster://a",
    ] {
        let e = with(bad, "").unwrap_err().to_string();
        assert!(e.contains("storage.url"), "{bad}: {e}");
    }
    let e = with("redis://x:1", "key_prefix = \"a{b}\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("storage.key_prefix"), "{e}");
}

#[test]
fn memory_needs_a_routed_summary_model_and_sane_values() {
    let c = parse(UPSTREAM).unwrap();
    assert!(!c.memory.summarize && !c.memory.carry_over);
    assert_eq!(c.memory.summary_every_messages, 10);
    assert_eq!(c.memory.summary_max_lag_messages, 50);
    let routed =
        "[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodels = [\"gpt-*\"]\n";
    for (memory, key) in [
        ("summarize = true", "memory.summary_model"),
        ("carry_over = true", "memory.summary_model"),
        (
            "summarize = true\nsummary_model = \"llama\"",
            "memory.summary_model",
        ),
        (
            "summarize = true\nsummary_model = \"gpt-x\"\nsummary_template = \"no slot\"",
            "memory.summary_template",
        ),
        (
            "carry_over = true\nsummary_model = \"gpt-x\"\ncarry_over_template = \"{summary}\"",
            "memory.carry_over_template",
        ),
        (
            "summarize = true\nsummary_model = \"gpt-x\"\nsummary_every_messages = 0",
            "memory.summary_every_messages",
        ),
        (
            "summarize = true\nsummary_model = \"gpt-x\"\nsummary_concurrency = 0",
            "memory.summary_concurrency",
        ),
        (
            "summarize = true\nsummary_model = \"gpt-x\"\nsummary_attempts = 0",
            "memory.summary_timeout_secs",
        ),
        (
            "summarize = true\nsummary_model = \"gpt-x\"\nsumarize = 1",
            "sumarize",
        ),
    ] {
        let e = parse(&format!("[memory]\n{memory}\n{routed}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{memory}: {e}");
    }
    let ok = parse(&format!(
        "[memory]\nsummarize = true\ncarry_over = true\nsummary_model = \"gpt-x\"\n{routed}"
    ))
    .unwrap();
    assert!(ok.memory.uses_model());
}

#[test]
fn background_calls_are_bounded_by_derived_or_configured_max_tokens() {
    let c = parse(UPSTREAM).unwrap();
    // chars / 3, rounded up, + 64; a note's longest is twice its size.
    assert_eq!(c.memory.summary_max_tokens(), 4000_u32.div_ceil(3) + 64);
    assert_eq!(c.memory.note_max_tokens(), 4000_u32.div_ceil(3) + 64);
    // 50 facts of 24 tokens, + 32; capped.
    assert_eq!(c.long_term.extract_max_tokens(), 50 * 24 + 32);
    assert_eq!(facts_tokens(100_000), MAX_DERIVED_EXTRACT_TOKENS);
    assert_eq!(tokens_for_chars(usize::MAX), MAX_ANSWER_TOKENS);
    let set = parse(&format!(
        "[memory]\nsummary_max_chars = 100\nsummary_max_tokens = 500\ncarry_over_max_chars = 10\n\
         [long_term]\nmax_facts_per_answer = 2\n{UPSTREAM}"
    ))
    .unwrap();
    assert_eq!(set.memory.summary_max_tokens(), 500);
    assert_eq!(set.memory.note_max_tokens(), 7 + 64);
    assert_eq!(set.long_term.extract_max_tokens(), 2 * 24 + 32);

    let memory = "[memory]\nsummarize = true\nsummary_model = \"m\"\n";
    let long_term = "[long_term]\nenabled = true\nextract_model = \"m\"\nembedding_model = \"m\"\n";
    for (extra, key) in [
        (
            format!("{memory}summary_max_tokens = 0"),
            "memory.summary_max_tokens",
        ),
        (
            format!("{memory}carry_over_max_tokens = 1000001"),
            "memory.carry_over_max_tokens",
        ),
        (
            format!("{long_term}extract_max_tokens = 0"),
            "long_term.extract_max_tokens",
        ),
    ] {
        let e = parse(&format!("{extra}\n{UPSTREAM}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
}

#[test]
fn structured_output_is_auto_unless_pinned() {
    let c = parse(UPSTREAM).unwrap();
    assert_eq!(c.upstreams[0].structured_output, StructuredOutput::Auto);
    for (word, way) in [
        ("json_schema", StructuredOutput::JsonSchema),
        ("json_object", StructuredOutput::JsonObject),
        ("none", StructuredOutput::None),
        ("auto", StructuredOutput::Auto),
    ] {
        let c = parse(&format!("{UPSTREAM}structured_output = \"{word}\"\n")).unwrap();
        assert_eq!(c.upstreams[0].structured_output, way);
        // What `recall check` prints parses back the same.
        let again = parse(&c.masked_toml()).unwrap();
        assert_eq!(again.upstreams[0].structured_output, way);
    }
    let e = parse(&format!("{UPSTREAM}structured_output = \"grammar\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("structured_output"), "{e}");
}

/// `[long_term]` with this embedding model, and an upstream that serves
/// only the extract model.
fn long_term_with(embedding_model: &str) -> Result<Config, ConfigError> {
    parse(&format!(
        "[long_term]\nenabled = true\nextract_model = \"x\"\nembedding_model = \"{embedding_model}\"\n\
         [[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodels = [\"x\"]\n"
    ))
}

#[test]
fn an_embedding_model_must_be_served_unless_it_is_local() {
    let e = long_term_with("text-embedding-3-small")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("long_term.embedding_model") && e.contains("served by no upstream"),
        "{e}"
    );
    let dir = std::env::temp_dir();
    let local = long_term_with(&format!("local:{}", dir.display()));
    if cfg!(feature = "local-embedder") {
        let c = local.unwrap();
        assert_eq!(c.long_term.local_embedder(), Some(dir.as_path()));
    } else {
        let e = local.unwrap_err().to_string();
        assert!(
            e.contains("long_term.embedding_model") && e.contains("`local-embedder` feature"),
            "{e}"
        );
    }
}

#[cfg(feature = "local-embedder")]
#[test]
fn a_local_embedding_model_needs_its_directory() {
    let missing = std::env::temp_dir().join("recall-no-such-model-dir");
    // A config is valid text before its files are in place; `recall check`
    // and startup say what is missing.
    let c = long_term_with(&format!("local:{}", missing.display())).unwrap();
    let e = c
        .check_files(Path::new("test.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("long_term.embedding_model")
            && e.contains(&format!("cannot read {}", missing.display()))
            && e.contains("test.toml"),
        "{e}"
    );
    let e = long_term_with("local:").unwrap_err().to_string();
    assert!(e.contains("must name a directory"), "{e}");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let c = long_term_with(&format!("local:{file}")).unwrap();
    let e = c
        .check_files(Path::new("test.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a directory"), "{e}");
    let there = long_term_with(&format!("local:{}", std::env::temp_dir().display())).unwrap();
    assert!(there.check_files(Path::new("test.toml")).is_ok());
}
