use super::*;

fn record(id: &str, namespace: &str, embedding: Vec<f32>, updated_at: i64) -> Record {
    Record {
        id: id.into(),
        text: id.into(),
        strategy: "semantic".into(),
        namespace: namespace.into(),
        user: "ada".into(),
        session: "s".into(),
        created_at: updated_at,
        updated_at,
        recalled_at: 0,
        said_at: None,
        superseded_by: None,
        valid_to: None,
        embedding: embedding.into(),
        terms: Default::default(),
    }
}

fn kept(answer: &str) -> Result<Vec<String>, Malformed> {
    facts(answer, 50, false).map(|f| f.kept)
}

#[test]
fn an_extraction_answer_is_a_list_of_facts_or_nothing() {
    let ok = kept(
        r#"[{"text": "Ada is allergic to peanuts"}, "Ada lives in Hanoi", {"text": "Ada lives in Hanoi"}]"#,
    );
    assert_eq!(
        ok.unwrap(),
        ["Ada is allergic to peanuts", "Ada lives in Hanoi"]
    );
    let fenced = kept("```json\n{\"facts\": [{\"text\": \"likes tea\"}]}\n```");
    assert_eq!(fenced.unwrap(), ["likes tea"]);
    assert_eq!(kept("[]").unwrap(), Vec::<String>::new());
    assert!(matches!(
        kept("Sure! Here are the facts"),
        Err(Malformed::NotJson(_))
    ));
    assert_eq!(kept(r#"{"text": "x"}"#), Err(Malformed::NotAList));
    assert_eq!(kept(r#"[{"fact": "x"}]"#), Err(Malformed::NoText(0)));
    assert_eq!(kept(r#"["a", " "]"#), Err(Malformed::NoText(1)));
}

#[test]
fn facts_embedded_in_prose_are_found() {
    let prose = r#"Here are the facts: {"facts": [{"text": "I live in Hanoi"}]} Hope this helps!"#;
    assert_eq!(kept(prose).unwrap(), ["I live in Hanoi"]);
    // A list, after brackets that hold no facts.
    let prose = r#"I found [2] facts {see below}: [{"text": "I have a cat"}, "I like tea"]."#;
    assert_eq!(kept(prose).unwrap(), ["I have a cat", "I like tea"]);
    assert_eq!(
        kept("Nothing to keep here: []").unwrap(),
        Vec::<String>::new()
    );
    // JSON that holds no facts, among prose or alone, is still malformed.
    assert!(matches!(
        kept(r#"Sure: {"name": "Saoceus"} and [1, 2]"#),
        Err(Malformed::NotJson(_))
    ));
    assert_eq!(kept(r#"{"name": "Saoceus"}"#), Err(Malformed::NotAList));
}

#[test]
fn an_answer_cut_off_at_max_tokens_keeps_its_whole_facts() {
    let cut = r#"{"facts": [{"text": "I live in Hanoi"}, {"text": "I am allergic to pea"#;
    let f = facts(cut, 50, true).unwrap();
    assert_eq!(
        (f.kept, f.cut_off),
        (vec!["I live in Hanoi".to_owned()], true)
    );
    let cut = r#"Here you go: ["I have a cat", "I like t"#;
    let f = facts(cut, 50, true).unwrap();
    assert_eq!((f.kept, f.cut_off), (vec!["I have a cat".to_owned()], true));
    // Nothing whole before the cut.
    assert_eq!(
        facts(r#"{"facts": [{"text": "I li"#, 50, true),
        Err(Malformed::CutOff)
    );
    assert_eq!(
        facts("I will now list the", 50, true),
        Err(Malformed::CutOff)
    );
    // Whole JSON is whole, whatever the finish reason says.
    let f = facts(r#"{"facts": ["a"]}"#, 50, true).unwrap();
    assert_eq!((f.kept, f.cut_off), (vec!["a".to_owned()], false));
    // A model that said it was done is not repaired.
    assert!(matches!(
        facts(r#"{"facts": [{"text": "a"}, {"te"#, 50, false),
        Err(Malformed::NotJson(_))
    ));
}

/// What SmolLM2 under llama-cpp-python's JSON grammar wrote: a line break
/// raw inside a fact's string, which JSON forbids.
#[test]
fn a_line_break_written_raw_inside_a_fact_is_read() {
    let answer = "{\"facts\": [{\"text\": \"I work as a nurse\nin Hanoi\"}, {\"text\": \"I am allergic to peanuts\"}]}";
    let f = facts(answer, 50, false).unwrap();
    assert_eq!(
        f.kept,
        vec!["I work as a nurse\nin Hanoi", "I am allergic to peanuts"]
    );
}

#[test]
fn the_schema_asks_for_what_the_prompt_describes() {
    let schema = facts_schema();
    assert_eq!(schema["required"], serde_json::json!(["facts"]));
    assert_eq!(schema["additionalProperties"], false);
    let item = &schema["properties"]["facts"]["items"];
    assert_eq!(item["required"], serde_json::json!(["text"]));
    assert_eq!(item["properties"]["text"]["type"], "string");
    assert_eq!(item["additionalProperties"], false);
    // An answer of that shape is read as it is.
    let answer = serde_json::json!({"facts": [{"text": "I live in Hanoi"}]}).to_string();
    assert_eq!(kept(&answer).unwrap(), ["I live in Hanoi"]);
    assert!(FORMAT.contains(r#"{"facts": [{"text": "..."}]}"#));
}

#[test]
fn an_answer_longer_than_the_limit_keeps_its_first_distinct_facts() {
    let answer = serde_json::to_string(&["a", "b", "a", "c", "d", "b", "e", "d"]).unwrap();
    let f = facts(&answer, 3, false).unwrap();
    assert_eq!(f.kept, ["a", "b", "c"]);
    // "d" and "e": a repeat is no fact of its own, kept or left out.
    assert_eq!(f.left_out, 2);
    assert_eq!(facts(&answer, 5, false).unwrap().left_out, 0);
    // Every item is still checked: a malformed one past the limit refuses
    // the answer as it would below it.
    assert_eq!(
        facts(r#"["a", "b", {"fact": "x"}]"#, 1, false),
        Err(Malformed::NoText(2))
    );
    // Ten thousand facts keep the limit's worth.
    let many: Vec<String> = (0..10_000).map(|i| format!("fact {i}")).collect();
    let f = facts(&serde_json::to_string(&many).unwrap(), 50, false).unwrap();
    assert_eq!((f.kept.len(), f.left_out), (50, 9_950));
    assert_eq!(f.kept, many[..50]);
}

#[test]
fn a_fact_too_long_to_embed_is_left_out_and_takes_no_place() {
    let longest = "é".repeat(MAX_FACT_CHARS);
    let over = format!("{longest}x");
    let answer = serde_json::to_string(&[&over, "a", &over, &longest, "b"]).unwrap();
    let f = facts(&answer, 2, false).unwrap();
    // Counted in characters, not bytes: the longest allowed is kept.
    assert_eq!(f.kept, ["a", longest.as_str()]);
    // The repeat of the long one is no fact of its own.
    assert_eq!((f.too_long, f.left_out), (1, 1));
}

#[test]
fn a_query_keeps_its_last_characters() {
    let said = |role, text: &str| Message::new(role, text.to_owned());
    let reply = said(Role::Assistant, &format!("start {}", "ü".repeat(3000)));
    let asked = said(Role::User, "What did I say?");
    let q = query_text(Some(&reply), &asked);
    assert_eq!(q.chars().count(), MAX_QUERY_CHARS);
    assert!(q.ends_with("ü\nWhat did I say?"));
    assert!(!q.contains("start"));
    // At the limit exactly, nothing is cut.
    let exact = said(Role::User, &"x".repeat(MAX_QUERY_CHARS));
    assert_eq!(query_text(None, &exact).len(), MAX_QUERY_CHARS);
    let multibyte = said(Role::User, &"ü".repeat(MAX_QUERY_CHARS));
    assert_eq!(
        query_text(None, &multibyte).chars().count(),
        MAX_QUERY_CHARS
    );
}

#[test]
fn cosine_is_bounded_and_zero_for_what_cannot_compare() {
    assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-6);
    assert!((cosine(&[1.0, 0.0], &[-1.0, 0.0]) + 1.0).abs() < 1e-6);
    assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
    assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
    assert_eq!(cosine(&[], &[]), 0.0);
}

proptest::proptest! {
    /// The lanes (and their tail) agree with one running sum in f64.
    #[test]
    fn cosine_agrees_with_the_plain_sum(
        pairs in proptest::collection::vec((-1.0f32..1.0, -1.0f32..1.0), 1..1600)
    ) {
        let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
        let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
        for (x, y) in a.iter().zip(&b) {
            let (x, y) = (f64::from(*x), f64::from(*y));
            dot += x * y;
            na += x * x;
            nb += y * y;
        }
        let plain = if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na.sqrt() * nb.sqrt()) };
        proptest::prop_assert!((f64::from(cosine(&a, &b)) - plain).abs() < 1e-5);
    }
}

#[test]
fn a_close_fact_updates_its_record_within_its_namespace_only() {
    let known = [
        record("peanuts", "/u/ada", vec![1.0, 0.1, 0.0], 1),
        record("hanoi", "/u/ada", vec![0.0, 1.0, 0.0], 2),
        record("other", "/u/bob", vec![1.0, 0.1, 0.0], 3),
    ];
    match merge(&known, "/u/ada", &[1.0, 0.12, 0.0], 0.92) {
        Merge::Update { index, score } => {
            assert_eq!(index, 0);
            assert!(score > 0.99);
        }
        Merge::Add => panic!("a duplicate was added"),
    }
    assert_eq!(merge(&known, "/u/ada", &[0.0, 0.0, 1.0], 0.92), Merge::Add);
    assert_eq!(merge(&known, "/u/carl", &[1.0, 0.1, 0.0], 0.92), Merge::Add);
}

#[test]
fn recall_ranks_by_score_within_limit_and_threshold() {
    let known = [
        record("a", "n", vec![1.0, 0.0], 1),
        record("b", "n", vec![0.8, 0.6], 2),
        record("c", "n", vec![0.0, 1.0], 3),
        record("a-newer", "n", vec![1.0, 0.0], 4),
    ];
    let top = rank(&known, &[1.0, 0.0], 2, 0.5);
    let ids: Vec<&str> = top.iter().map(|(r, _)| r.id.as_str()).collect();
    assert_eq!(ids, ["a-newer", "a"]);
    let all = rank(&known, &[1.0, 0.0], 10, 0.5);
    assert_eq!(all.len(), 3, "c scores 0");
    assert!(rank(&known, &[1.0, 0.0], 10, 1.0).len() == 2);
}

#[test]
fn a_full_user_gives_up_what_was_least_recently_used() {
    let mut known = vec![
        record("old", "n", vec![1.0], 1),
        record("used", "n", vec![1.0], 2),
        record("new", "n", vec![1.0], 3),
    ];
    known[1].recalled_at = 10;
    assert_eq!(evict(&known, 3), Vec::<usize>::new());
    assert_eq!(evict(&known, 2), [0]);
    assert_eq!(evict(&known, 1), [0, 2]);
    assert_eq!(
        namespace(
            "/strategies/{strategy}/users/{user}",
            "semantic",
            "ada",
            "s1"
        ),
        "/strategies/semantic/users/ada"
    );
}

fn fact(text: &str, namespace: &str, embedding: Vec<f32>) -> NewFact {
    NewFact {
        text: text.into(),
        strategy: "semantic".into(),
        namespace: namespace.into(),
        said_at: None,
        embedding,
    }
}

fn ids() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("new{n}")
    }
}

#[test]
fn a_plan_updates_close_facts_adds_others_and_evicts_the_least_used() {
    let mut old = record("old", "/u/ada", vec![0.0, 1.0, 0.0], 1);
    old.recalled_at = 5;
    let known = vec![old, record("peanuts", "/u/ada", vec![1.0, 0.0, 0.0], 2)];
    let origin = Origin {
        user: "ada",
        session: "s2",
        now_ms: 10,
    };
    let facts = vec![
        // Updates "peanuts"; then the next one updates it again.
        fact("allergic to peanuts", "/u/ada", vec![1.0, 0.01, 0.0]),
        fact("very allergic to peanuts", "/u/ada", vec![1.0, 0.0, 0.01]),
        // Adds; and a copy of it in the same answer updates the added one.
        fact("lives in Hanoi", "/u/ada", vec![0.0, 0.0, 1.0]),
        fact("lives in Hanoi", "/u/ada", vec![0.0, 0.0, 1.0]),
        // Another namespace never merges.
        fact("lives in Hanoi", "/other/ada", vec![0.0, 0.0, 1.0]),
    ];
    let plan = plan(&known, facts.clone(), &origin, 0.92, 10, ids());
    assert_eq!((plan.added, plan.updated, plan.evicted), (2, 1, 0));
    let peanuts = plan.put.iter().find(|r| r.id == "peanuts").unwrap();
    assert_eq!(
        (
            peanuts.text.as_str(),
            peanuts.session.as_str(),
            peanuts.updated_at
        ),
        ("very allergic to peanuts", "s2", 10)
    );
    assert!(plan.remove.is_empty());
    // Past the bound, the least recently used record goes, not the new.
    let plan = super::plan(&known, facts, &origin, 0.92, 3, ids());
    assert_eq!(plan.remove, vec!["old".to_owned()]);
    assert_eq!((plan.added, plan.updated, plan.evicted), (2, 1, 1));
}

/// `plan`'s merging as it was written before it scored the known records
/// in one pass: each fact against every record, one fact after another.
fn merged_fact_by_fact(known: &[Record], facts: Vec<NewFact>, threshold: f32) -> Vec<Record> {
    let mut now: Vec<Record> = known.to_vec();
    let mut new_id = ids();
    for f in facts {
        let embedding = Embedding::from(f.embedding);
        let probe = Probe::of(&embedding);
        let closest = now
            .iter()
            .enumerate()
            .filter(|(_, r)| r.namespace == f.namespace)
            .map(|(i, r)| (i, probe.cosine(&r.embedding)))
            .filter(|&(_, score)| score >= threshold)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i);
        match closest {
            Some(i) => {
                now[i].text = f.text;
                now[i].embedding = embedding;
            }
            None => now.push(Record {
                text: f.text,
                embedding,
                ..record(&new_id(), &f.namespace, Vec::new(), 0)
            }),
        }
    }
    now
}

#[test]
fn a_record_an_earlier_fact_updated_is_scored_as_it_now_is() {
    let known = vec![record("a", "/u/ada", vec![1.0, 0.0, 0.0], 1)];
    let origin = Origin {
        user: "ada",
        session: "s",
        now_ms: 2,
    };
    let facts = vec![
        // 0.93 to "a" as stored: updates it.
        fact("first", "/u/ada", vec![1.0, 0.4, 0.0]),
        // 0.78 to "a" as stored, 0.96 to "a" as the first fact left it.
        fact("second", "/u/ada", vec![1.0, 0.8, 0.0]),
    ];
    let plan = plan(&known, facts, &origin, 0.92, 10, ids());
    assert_eq!((plan.added, plan.updated), (0, 1));
    assert_eq!(plan.put[0].text, "second");
}

proptest::proptest! {
    /// Scoring the known records once for all the facts changes nothing:
    /// the same records are updated (also one an earlier fact of the same
    /// answer updated or added), with the same texts and vectors.
    #[test]
    fn a_plan_merges_as_fact_by_fact_scoring_would(
        known in proptest::collection::vec((0u8..2, proptest::collection::vec(0u8..3, 3)), 0..10),
        facts in proptest::collection::vec((0u8..2, proptest::collection::vec(0u8..3, 3)), 0..8),
    ) {
        let ns = |n: u8| if n == 0 { "/u/ada" } else { "/other" };
        let v = |v: &[u8]| v.iter().map(|&x| f32::from(x)).collect::<Vec<f32>>();
        let known: Vec<Record> = known
            .iter()
            .enumerate()
            .map(|(i, (n, e))| record(&format!("k{i:02}"), ns(*n), v(e), 1))
            .collect();
        let facts: Vec<NewFact> = facts
            .iter()
            .enumerate()
            .map(|(i, (n, e))| fact(&format!("fact {i}"), ns(*n), v(e)))
            .collect();
        let origin = Origin { user: "ada", session: "s", now_ms: 1 };
        let plan = plan(&known, facts.clone(), &origin, 0.9, 100, ids());
        let mut expected = merged_fact_by_fact(&known, facts, 0.9);
        expected.retain(|r| r.id.starts_with("new") || !known.contains(r));
        let got: Vec<(&str, &str, &[f32])> = plan
            .put
            .iter()
            .map(|r| (r.id.as_str(), r.text.as_str(), &*r.embedding))
            .collect();
        let want: Vec<(&str, &str, &[f32])> = expected
            .iter()
            .map(|r| (r.id.as_str(), r.text.as_str(), &*r.embedding))
            .collect();
        proptest::prop_assert_eq!(got, want);
    }
}

#[test]
fn the_facts_a_turn_sends_have_no_repeats_and_a_new_session_gets_the_newest() {
    let a = record("a", "/x", vec![1.0, 0.0], 1);
    let mut b = record("b", "/y", vec![1.0, 0.0], 3);
    b.text = "a".into();
    let c = record("c", "/x", vec![0.0, 1.0], 2);
    let ranked = vec![(&a, 0.9), (&b, 0.9), (&c, 0.5)];
    let sent: Vec<String> = recalled(&ranked).into_iter().map(|f| f.text).collect();
    assert_eq!(sent, ["a", "c"]);
    let records = vec![a.clone(), b.clone(), c.clone()];
    let newest: Vec<String> = recent(&records, 2).into_iter().map(|f| f.id).collect();
    assert_eq!(newest, ["b", "c"]);
    assert_eq!(facts_message("Facts:\n{facts}", &[]), None);
    let m = facts_message("Facts:\n{facts}", &recent(&records, 5)).unwrap();
    assert_eq!(m.content, serde_json::json!("Facts:\n- a\n- c"));
}

#[test]
fn the_extraction_prompt_reads_the_conversation_as_heard() {
    let said = |role, text: &str| Arc::new(Message::new(role, text.to_owned()));
    let messages = vec![
        said(Role::System, "be brief"),
        said(Role::User, "I am allergic to peanuts."),
        said(Role::Assistant, "Noted."),
    ];
    let prompt = extract_prompt("Find facts.", &messages);
    let system = prompt[0]["content"].as_str().unwrap();
    assert!(system.starts_with("Find facts.\n\nAnswer with a JSON object {\"facts\""));
    let user = prompt[1]["content"].as_str().unwrap();
    assert_eq!(
        user,
        format!("{EXTRACT_HEADING}\nuser: I am allergic to peanuts.\nassistant: Noted.\n")
    );
    assert!(worth_extracting(&messages));
    assert!(!worth_extracting(&messages[..1]));
    assert_eq!(
        query_text(Some(&messages[2]), &messages[1]),
        "Noted.\nI am allergic to peanuts."
    );
}

#[test]
fn names_are_shown_without_the_tenant() {
    let users = vec!["ana".to_owned(), "na".to_owned()];
    assert_eq!(
        shown_names("t1:ana", "t1:s1", &users),
        ("ana".to_owned(), "s1".to_owned())
    );
    assert_eq!(
        shown_names("ana", "s1", &users),
        ("ana".to_owned(), "s1".to_owned())
    );
    assert_eq!(
        shown_names("t1:bob", "t1:s1", &users),
        ("t1:bob".to_owned(), "t1:s1".to_owned())
    );
}
