//! Hybrid ranking: a user's records ranked by meaning (cosine similarity
//! of embeddings) and by words (BM25 over the records' terms), the two
//! rankings fused by their ranks (reciprocal rank fusion). Embeddings find
//! what is said in other words; BM25 finds the rare words an embedding
//! model smooths over (names, places, "violin"). Exact, over every record.

use bm25::{EmbedderBuilder, Scorer, Tokenizer};

use super::{words, Probe, Record};

/// Reciprocal rank fusion's constant (Cormack et al.): a record's share
/// of a ranking is `1 / (K + rank)`.
const K: f32 = 60.0;

/// Terms already split and joined by spaces (`words::terms`), read back.
#[derive(Default)]
struct Spaced;

impl Tokenizer for Spaced {
    fn tokenize(&self, text: &str) -> Vec<String> {
        text.split(' ')
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// `records` ranked for a query (its embedding and its text), best
/// first: those scoring at least `threshold` by cosine, or sharing a term
/// with the query; at most `limit`. Each with its cosine similarity.
pub fn rank<'a, R: AsRef<Record>>(
    records: &'a [R],
    query: &[f32],
    query_text: &str,
    limit: usize,
    threshold: f32,
) -> Vec<(&'a R, f32)> {
    let probe = Probe::new(query);
    let cosines: Vec<f32> = records
        .iter()
        .map(|r| probe.cosine(&r.as_ref().embedding))
        .collect();
    let keyword = keyword_ranks(records, query_text);
    let mut by_meaning: Vec<usize> = (0..records.len()).collect();
    by_meaning.sort_by(|&a, &b| {
        cosines[b]
            .total_cmp(&cosines[a])
            .then_with(|| newer(records, a, b))
    });
    let mut fused = vec![0f32; records.len()];
    for (rank, &i) in by_meaning.iter().enumerate() {
        fused[i] = 1.0 / (K + rank as f32 + 1.0);
    }
    for (rank, &i) in keyword.iter().enumerate() {
        fused[i] += 1.0 / (K + rank as f32 + 1.0);
    }
    let matched: Vec<bool> = {
        let mut m = vec![false; records.len()];
        for &i in &keyword {
            m[i] = true;
        }
        m
    };
    let mut order: Vec<usize> = (0..records.len())
        .filter(|&i| cosines[i] >= threshold || matched[i])
        .collect();
    order.sort_by(|&a, &b| {
        fused[b]
            .total_cmp(&fused[a])
            .then_with(|| cosines[b].total_cmp(&cosines[a]))
            .then_with(|| newer(records, a, b))
    });
    order.truncate(limit);
    order
        .into_iter()
        .map(|i| (&records[i], cosines[i]))
        .collect()
}

fn newer<R: AsRef<Record>>(records: &[R], a: usize, b: usize) -> std::cmp::Ordering {
    records[b]
        .as_ref()
        .updated_at
        .cmp(&records[a].as_ref().updated_at)
}

/// The indexes of the records sharing a term with `query`, by BM25 score,
/// best first.
fn keyword_ranks<R: AsRef<Record>>(records: &[R], query: &str) -> Vec<usize> {
    let query_terms = words::terms(query);
    if query_terms.is_empty() || records.is_empty() {
        return Vec::new();
    }
    let terms: Vec<String> = records
        .iter()
        .map(|r| words::terms(&r.as_ref().text).join(" "))
        .collect();
    let lengths: usize = terms.iter().map(|t| t.split(' ').count()).sum();
    let avgdl = lengths as f32 / records.len() as f32;
    let embedder = EmbedderBuilder::<u32, Spaced>::with_avgdl(avgdl.max(1.0))
        .tokenizer(Spaced)
        .build();
    let mut scorer: Scorer<usize, u32> = Scorer::new();
    for (i, t) in terms.iter().enumerate() {
        scorer.upsert(&i, embedder.embed(t));
    }
    let mut matches = scorer.matches(&embedder.embed(&query_terms.join(" ")));
    // Ties in index order, so that a ranking never depends on hashing.
    matches.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
    matches.into_iter().map(|m| m.id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, text: &str, embedding: Vec<f32>) -> Record {
        Record {
            id: id.into(),
            text: text.into(),
            strategy: "verbatim".into(),
            namespace: "n".into(),
            user: "ada".into(),
            session: "s".into(),
            created_at: 0,
            updated_at: 0,
            recalled_at: 0,
            said_at: None,
            embedding: embedding.into(),
        }
    }

    #[test]
    fn a_rare_word_lifts_a_record_the_embedding_ranks_low() {
        let records = [
            rec("a", "I love music and concerts", vec![1.0, 0.0]),
            rec("b", "We went hiking on Sunday", vec![0.9, 0.1]),
            rec("c", "I play the violin every evening", vec![0.1, 1.0]),
        ];
        let query = [1.0, 0.05];
        let by_meaning = crate::memory::long_term::rank(&records, &query, 3, 0.0);
        assert_eq!(by_meaning[2].0.id, "c");
        let ranked = rank(&records, &query, "Does she still play the violin?", 3, 0.0);
        let ids: Vec<&str> = ranked.iter().map(|(r, _)| r.id.as_str()).collect();
        assert_eq!(ids[0], "c", "{ids:?}");
        // The score shown is still the cosine.
        assert!((ranked[0].1 - crate::memory::long_term::cosine(&query, &[0.1, 1.0])).abs() < 1e-6);
    }

    #[test]
    fn below_the_threshold_only_a_shared_word_keeps_a_record() {
        let records = [
            rec("a", "I adopted a puppy", vec![0.0, 1.0]),
            rec("b", "The weather was nice", vec![0.0, 1.0]),
        ];
        let ranked = rank(&records, &[1.0, 0.0], "Tell me about the puppy", 5, 0.5);
        let ids: Vec<&str> = ranked.iter().map(|(r, _)| r.id.as_str()).collect();
        assert_eq!(ids, ["a"]);
        assert!(rank(&records, &[1.0, 0.0], "", 5, 0.5).is_empty());
        assert_eq!(rank(&records, &[0.0, 1.0], "", 1, 0.5).len(), 1);
    }
}
