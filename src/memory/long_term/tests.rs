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
        embedding,
    }
}

#[test]
fn an_extraction_answer_is_a_list_of_facts_or_nothing() {
    let ok = facts(
        r#"[{"text": "Ada is allergic to peanuts"}, "Ada lives in Hanoi", {"text": "Ada lives in Hanoi"}]"#,
    );
    assert_eq!(
        ok.unwrap(),
        ["Ada is allergic to peanuts", "Ada lives in Hanoi"]
    );
    let fenced = facts("```json\n{\"facts\": [{\"text\": \"likes tea\"}]}\n```");
    assert_eq!(fenced.unwrap(), ["likes tea"]);
    assert_eq!(facts("[]").unwrap(), Vec::<String>::new());
    assert!(matches!(
        facts("Sure! Here are the facts"),
        Err(Malformed::NotJson(_))
    ));
    assert_eq!(facts(r#"{"text": "x"}"#), Err(Malformed::NotAList));
    assert_eq!(facts(r#"[{"fact": "x"}]"#), Err(Malformed::NoText(0)));
    assert_eq!(facts(r#"["a", " "]"#), Err(Malformed::NoText(1)));
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
