//! Hybrid ranking: a user's records ranked by meaning (cosine similarity
//! of embeddings) and by words (BM25 over the records' terms), the two
//! rankings fused by their ranks (reciprocal rank fusion). Embeddings find
//! what is said in other words; BM25 finds the rare words an embedding
//! model smooths over (names, places, "violin"). Exact, over every record;
//! the terms are bm25's tokenizer's (`words`).

use super::{words, Probe, Record};

/// Reciprocal rank fusion's constant (Cormack et al.): a record's share
/// of a ranking is `1 / (K + rank)`.
const K: f32 = 60.0;

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
    let mut matched = vec![false; records.len()];
    for (rank, &i) in keyword.iter().enumerate() {
        fused[i] += 1.0 / (K + rank as f32 + 1.0);
        matched[i] = true;
    }
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

/// Okapi BM25's constants, as usual (and as the bm25 crate's).
const K1: f32 = 1.2;
const B: f32 = 0.75;

/// The indexes of the records sharing a term with `query`, by BM25 score,
/// best first. Scored here over each record's cached terms: the bm25
/// crate's scorer is an index to build, and a user's records change
/// between searches, so it would be built again for each.
fn keyword_ranks<R: AsRef<Record>>(records: &[R], query: &str) -> Vec<usize> {
    let mut asked = words::term_ids(query);
    asked.sort_unstable();
    asked.dedup();
    if asked.is_empty() || records.is_empty() {
        return Vec::new();
    }
    // Each record's count of each asked term, and its length.
    let mut counts: Vec<(usize, Vec<u32>, usize)> = Vec::new();
    let mut df = vec![0u32; asked.len()];
    let mut total_len = 0usize;
    for (i, r) in records.iter().enumerate() {
        let r = r.as_ref();
        let terms = r.terms.of(&r.text);
        total_len += terms.len();
        // Most records share no term with the query: no counts for them.
        let mut tf: Option<Vec<u32>> = None;
        for t in terms {
            if let Ok(k) = asked.binary_search(t) {
                tf.get_or_insert_with(|| vec![0; asked.len()])[k] += 1;
            }
        }
        if let Some(tf) = tf {
            for (d, &n) in df.iter_mut().zip(&tf) {
                *d += u32::from(n > 0);
            }
            counts.push((i, tf, terms.len()));
        }
    }
    let n = records.len() as f32;
    let avgdl = (total_len as f32 / n).max(1.0);
    let idf: Vec<f32> = df
        .iter()
        .map(|&d| (1.0 + (n - d as f32 + 0.5) / (d as f32 + 0.5)).ln())
        .collect();
    let mut scored: Vec<(usize, f32)> = counts
        .into_iter()
        .map(|(i, tf, len)| {
            let norm = K1 * (1.0 - B + B * len as f32 / avgdl);
            let score = tf
                .iter()
                .zip(&idf)
                .filter(|(&f, _)| f > 0)
                .map(|(&f, idf)| idf * f as f32 * (K1 + 1.0) / (f as f32 + norm))
                .sum();
            (i, score)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.into_iter().map(|(i, _)| i).collect()
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
            superseded_by: None,
            valid_to: None,
            embedding: embedding.into(),
            terms: Default::default(),
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
