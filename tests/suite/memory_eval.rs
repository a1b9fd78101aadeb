//! The memory evaluation's own code (benches/memory), tested here: a
//! bench without the test harness runs no tests.

#[allow(dead_code)]
#[path = "../../benches/memory/locomo.rs"]
mod locomo;
#[path = "../../benches/memory/score.rs"]
mod score;

use std::path::Path;

use locomo::{date_ms, load};
use score::{content_words, f1, Context};

#[test]
fn evidence_is_in_context_when_most_of_its_words_are() {
    let line = "I went to a LGBTQ support group yesterday and it was so powerful.";
    // went, lgbtq, support, group, yesterday, powerful: 6 words.
    assert_eq!(content_words(line).len(), 6);
    let c = Context::new("- (8 May 2023) I went to a LGBTQ support group yesterday");
    assert!((c.share(line) - 5.0 / 6.0).abs() < 1e-9);
    assert!(c.holds_evidence(line));
    let c = Context::new("Caroline likes a support group.");
    assert!(!c.holds_evidence(line));
    assert!(Context::new("").holds_evidence("Thanks!"));
}

#[test]
fn an_answer_is_in_context_when_all_its_words_are() {
    let c = Context::new("(7 May 2023) I researched adoption agencies.");
    assert!(c.holds_answer("Adoption agencies"));
    assert!(c.holds_answer("7 May 2023"));
    assert!(!c.holds_answer("Psychology, counseling certification"));
}

#[test]
fn f1_is_locomos() {
    assert_eq!(f1("The adoption agencies", "adoption agencies"), 1.0);
    assert!((f1("adoption", "adoption agencies") - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(f1("cats", "dogs"), 0.0);
}

#[test]
fn dates_read_as_utc() {
    assert_eq!(date_ms("1:56 pm on 8 May, 2023"), Some(1_683_554_160_000));
    assert_eq!(
        date_ms("12:05 am on 1 January, 2024"),
        Some(1_704_067_500_000)
    );
    assert_eq!(date_ms("noon on 8 May, 2023"), None);
}

#[test]
fn the_conversation_in_the_repository_reads_whole() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/locomo/26.json");
    let c = load(&path).unwrap();
    assert_eq!(c.len(), 1);
    let c = &c[0];
    assert_eq!(c.sessions.len(), 19);
    assert_eq!(c.sessions.iter().map(Vec::len).sum::<usize>(), 419);
    let first = &c.sessions[0][0];
    assert!(first.user && first.id == "D1:1" && first.at_ms == 1_683_554_160_000);
    // Turns half a minute apart.
    assert_eq!(c.sessions[0][1].at_ms - first.at_ms, 30_000);
    // A photo's caption is said with its line, not part of the evidence.
    assert!(c
        .sessions
        .iter()
        .flatten()
        .any(|t| t.text.contains("[shares a photo of") && !t.line.contains("[shares")));
    let asked = c.asked();
    assert_eq!(asked.len(), 74);
    assert!(asked.iter().all(|q| (1..=4).contains(&q.category)));
}
