//! The local embedder measured: the cosines it gives the kinds of pairs
//! long-term memory meets (what `score_threshold` and `merge_threshold`
//! are chosen from), and how many sentences a second it embeds.
//!
//! `cargo run --release --example embedder -- <model dir>` (or with the
//! directory in `RECALL_TEST_MINILM_DIR`): a sentence-transformers folder
//! such as all-MiniLM-L6-v2.

use std::path::PathBuf;
use std::time::Instant;

use recall::memory::long_term::cosine;
use recall::models::local::LocalEmbedding;
use recall::models::EmbeddingModel;

/// A fact and what a later turn says when that fact should be sent.
const RELATED: &[(&str, &str)] = &[
    (
        "I am allergic to peanuts",
        "What snack should I bring to the party?",
    ),
    (
        "I am allergic to peanuts",
        "Can you suggest a recipe for dinner?",
    ),
    ("I live in Hanoi", "What's the weather like this weekend?"),
    ("I live in Hanoi", "Which restaurants near me are good?"),
    (
        "I have two daughters, Mai and Lan",
        "What gift should I buy for my kids?",
    ),
    (
        "I work as a nurse at a hospital",
        "How can I cope with night shifts?",
    ),
    ("I am vegetarian", "What should I cook tonight?"),
    (
        "I have a dog named Max",
        "How often should I take my pet to the vet?",
    ),
    (
        "I am learning to play the guitar",
        "Can you recommend some songs to practice?",
    ),
    (
        "My wife's birthday is in March",
        "When is my wife's birthday?",
    ),
    (
        "I am training for a marathon in October",
        "How far should I run this week?",
    ),
    (
        "I drive a Toyota Corolla",
        "When should I change my car's oil?",
    ),
    ("I am afraid of flying", "How should I travel to Paris?"),
    ("I have type 2 diabetes", "Is it okay for me to eat cake?"),
    (
        "I speak Vietnamese and English",
        "Can you translate this sentence for me?",
    ),
    (
        "My favourite cuisine is Japanese",
        "Where should we go for dinner?",
    ),
    (
        "I am a software engineer at a startup",
        "How do I ask my boss for a raise?",
    ),
    ("I am lactose intolerant", "Can you suggest a breakfast?"),
    (
        "I moved to Berlin last year",
        "What documents do I need to renew my visa?",
    ),
    ("I prefer short answers", "Explain how a car engine works."),
    (
        "The user is allergic to peanuts",
        "What snack should I bring to the party?",
    ),
    (
        "The user has a dog named Max",
        "My pet seems sick, what should I do?",
    ),
];

/// A fact and a turn about something else.
const UNRELATED: &[(&str, &str)] = &[
    ("I am allergic to peanuts", "Can you recommend some music?"),
    ("I live in Hanoi", "What snack should I bring to the party?"),
    (
        "I have two daughters, Mai and Lan",
        "How do I fix a flat bicycle tire?",
    ),
    (
        "I work as a nurse at a hospital",
        "What is the capital of Australia?",
    ),
    (
        "I have a dog named Max",
        "Explain how compound interest works.",
    ),
    (
        "I drive a Toyota Corolla",
        "Can you recommend a good novel?",
    ),
    (
        "I am learning to play the guitar",
        "What should I cook tonight?",
    ),
    (
        "I have type 2 diabetes",
        "How do I set up a Python virtual environment?",
    ),
    (
        "I speak Vietnamese and English",
        "How far should I run this week?",
    ),
    (
        "My favourite cuisine is Japanese",
        "How do I reset my router?",
    ),
    (
        "I am vegetarian",
        "Which programming language should I learn first?",
    ),
    (
        "I moved to Berlin last year",
        "What gift should I buy for my kids?",
    ),
];

/// The same fact, written again.
const DUPLICATES: &[(&str, &str)] = &[
    ("I am allergic to peanuts", "I am allergic to peanuts!"),
    ("I am allergic to peanuts", "I'm allergic to peanuts"),
    ("I live in Hanoi", "i live in hanoi."),
    (
        "I have two daughters, Mai and Lan",
        "I have two daughters: Mai and Lan",
    ),
    ("I work as a nurse", "I work as a nurse."),
    (
        "The user is allergic to peanuts",
        "User is allergic to peanuts",
    ),
    ("The user lives in Hanoi", "The user lives in Hanoi."),
];

/// The same fact in other words.
const NEAR_DUPLICATES: &[(&str, &str)] = &[
    ("I am allergic to peanuts", "I have a peanut allergy"),
    ("I live in Hanoi", "My home is in Hanoi"),
    (
        "I have two daughters, Mai and Lan",
        "My two daughters are called Mai and Lan",
    ),
    (
        "I work as a nurse at a hospital",
        "I am a nurse at the hospital",
    ),
    ("I am vegetarian", "I don't eat meat"),
    ("I have a dog named Max", "My dog is called Max"),
    (
        "My favourite cuisine is Japanese",
        "I love Japanese food the most",
    ),
    (
        "I am allergic to peanuts",
        "The user is allergic to peanuts",
    ),
    (
        "The user lives in Hanoi",
        "The user lives in Hanoi, Vietnam",
    ),
];

/// Two facts of one topic: both must be kept.
const DISTINCT: &[(&str, &str)] = &[
    ("I am allergic to peanuts", "I am allergic to shellfish"),
    ("I live in Hanoi", "My parents live in Hanoi"),
    (
        "I have two daughters, Mai and Lan",
        "I have a son named Minh",
    ),
    (
        "I work as a nurse at a hospital",
        "My husband works as a teacher",
    ),
    ("I have a dog named Max", "I have a cat named Luna"),
    ("I drive a Toyota Corolla", "I want to buy an electric car"),
    (
        "I am learning to play the guitar",
        "I am learning to speak French",
    ),
    ("My wife's birthday is in March", "My birthday is in June"),
    ("I live in Hanoi", "I live in Berlin"),
    (
        "The user is allergic to peanuts",
        "The user's son is allergic to peanuts",
    ),
    ("The user has two daughters", "The user has two sons"),
];

#[tokio::main]
async fn main() {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .or_else(|| std::env::var_os("RECALL_TEST_MINILM_DIR"))
        .expect("usage: embedder <model dir> (or RECALL_TEST_MINILM_DIR)")
        .into();
    let started = Instant::now();
    let model = LocalEmbedding::start("local", &dir)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("loaded in {:.2} s", started.elapsed().as_secs_f64());

    println!("\n| pairs | n | min | median | max |\n| --- | --- | --- | --- | --- |");
    for (name, pairs) in [
        ("related (fact, later turn)", RELATED),
        ("unrelated", UNRELATED),
        ("duplicates", DUPLICATES),
        ("near-duplicates (paraphrases)", NEAR_DUPLICATES),
        ("distinct facts of one topic", DISTINCT),
    ] {
        let scores = scores(&model, pairs).await;
        let mut sorted: Vec<f32> = scores.iter().map(|(s, _)| *s).collect();
        sorted.sort_by(f32::total_cmp);
        let median = sorted[sorted.len() / 2];
        println!(
            "| {name} | {} | {:.3} | {median:.3} | {:.3} |",
            sorted.len(),
            sorted[0],
            sorted[sorted.len() - 1]
        );
        for (s, (a, b)) in scores {
            eprintln!("{name:<32} {s:.3}  {a:?} / {b:?}");
        }
    }

    let short: Vec<String> = RELATED
        .iter()
        .chain(UNRELATED)
        .flat_map(|(a, b)| [a.to_string(), b.to_string()])
        .collect();
    println!("\n| how | sentences/s |\n| --- | --- |");
    // Warm up: the first pass allocates what later ones reuse.
    model.embed(short[..16].to_vec()).await.unwrap();
    let n = 128;
    let t = Instant::now();
    for i in 0..n {
        model
            .embed(vec![short[i % short.len()].clone()])
            .await
            .unwrap();
    }
    rate("one sentence a call, one call at a time", n, t);
    for batch in [16, 64] {
        let texts: Vec<String> = short.iter().cycle().take(batch).cloned().collect();
        let rounds = 512 / batch;
        let t = Instant::now();
        for _ in 0..rounds {
            model.embed(texts.clone()).await.unwrap();
        }
        rate(&format!("{batch} sentences a call"), rounds * batch, t);
    }
    let t = Instant::now();
    let calls = short
        .iter()
        .cycle()
        .take(n)
        .map(|s| model.embed(vec![s.clone()]));
    futures_util::future::join_all(calls).await;
    rate(&format!("{n} calls of one sentence at once"), n, t);
    // The longest a text gets: the model's whole input (256 tokens for
    // all-MiniLM-L6-v2), where attention's cost grows with its square.
    let long = vec!["I am allergic to peanuts and I live in Hanoi. ".repeat(30); 8];
    let t = Instant::now();
    for _ in 0..4 {
        model.embed(long.clone()).await.unwrap();
    }
    rate("8 texts of the longest a call (256 tokens each)", 32, t);
}

async fn scores<'a>(
    model: &LocalEmbedding,
    pairs: &'a [(&'a str, &'a str)],
) -> Vec<(f32, (&'a str, &'a str))> {
    let texts: Vec<String> = pairs
        .iter()
        .flat_map(|(a, b)| [a.to_string(), b.to_string()])
        .collect();
    let v = model.embed(texts).await.unwrap();
    pairs
        .iter()
        .enumerate()
        .map(|(i, p)| (cosine(&v[2 * i], &v[2 * i + 1]), *p))
        .collect()
}

fn rate(how: &str, n: usize, since: Instant) {
    let secs = since.elapsed().as_secs_f64();
    println!("| {how} | {:.0} |", n as f64 / secs);
}
