//! Facts that supersede older ones, with no model: a first-person
//! statement of a state a person has one of at a time (where they live,
//! where or as what they work, their name, their age, whether they are
//! married) replaces the user's older records stating the same state.
//! The older record is kept, marked (`superseded_by`, `valid_to`), and is
//! never sent beside the newer one. What falls outside these states is
//! not judged: two records about other things both stay current.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;

use super::{Plan, Record};

/// The states, each with what a sentence says when it sets it (lower
/// case, in the first person).
const STATES: &[(&str, &str)] = &[
    (
        "home",
        r"\b(i|we)\s+(now\s+|still\s+|just\s+|recently\s+|finally\s+)?(live|moved|relocated)\s+(in|to|into)\b|\bi'm\s+(now\s+)?(living|moving)\s+(in|to)\b|\bmy\s+(new\s+)?home\s+is\s+in\b",
    ),
    (
        "work",
        r"\bi\s+(now\s+|still\s+|just\s+)?work\s+(at|for|as)\b|\bi'm\s+(now\s+)?(working|employed)\s+(at|for|as)\b|\bmy\s+(new\s+)?job\s+is\b|\bi\s+(just\s+)?(got|started)\s+a\s+(new\s+)?job\s+(at|as)\b",
    ),
    ("name", r"\bmy\s+name\s+is\b|\bcall\s+me\b"),
    (
        "age",
        r"\bi\s+am\s+\d+\s+years?\s+old\b|\bi'm\s+\d+\s+years?\s+old\b|\bi\s+(just\s+)?turned\s+\d+\b",
    ),
    (
        "partner",
        r"\bi\s+(am|'m|got)\s+(now\s+)?(married|divorced|engaged|single|separated|widowed)\b|\bi'm\s+(now\s+)?(married|divorced|engaged|single|separated|widowed)\b",
    ),
];

fn patterns() -> &'static [(&'static str, Regex)] {
    static P: OnceLock<Vec<(&'static str, Regex)>> = OnceLock::new();
    P.get_or_init(|| {
        STATES
            .iter()
            .filter_map(|(state, re)| Some((*state, Regex::new(re).ok()?)))
            .collect()
    })
}

/// The state `text` sets, if it sets one.
pub fn state(text: &str) -> Option<&'static str> {
    let text = text.to_lowercase().replace('\u{2019}', "'");
    patterns()
        .iter()
        .find(|(_, re)| re.is_match(&text))
        .map(|(state, _)| *state)
}

/// Whether a record is still current.
pub fn current(r: &Record) -> bool {
    r.superseded_by.is_none()
}

/// Marks, in `plan`, the records the plan's new or changed ones
/// supersede: of each namespace and state a new or changed record sets,
/// the one said last stays current and the others, known or new, are
/// superseded by it from when it was said (or `now_ms`). Returns how many
/// were marked.
pub fn apply<R: AsRef<Record>>(known: &[R], plan: &mut Plan, now_ms: i64) -> usize {
    let removed: std::collections::HashSet<&str> = plan.remove.iter().map(String::as_str).collect();
    let putting: HashMap<&str, usize> = plan
        .put
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    // (namespace, state) -> the candidates: put records, then known ones
    // the plan does not change.
    let mut groups: HashMap<(String, &'static str), Vec<Candidate>> = HashMap::new();
    for (i, r) in plan.put.iter().enumerate() {
        if let (true, Some(s)) = (current(r), state(&r.text)) {
            groups
                .entry((r.namespace.clone(), s))
                .or_default()
                .push(Candidate::Put(i, when(r)));
        }
    }
    // Most extractions state no such thing: the user's records are not
    // read for one.
    if groups.is_empty() {
        return 0;
    }
    for (i, r) in known.iter().map(AsRef::as_ref).enumerate() {
        if removed.contains(r.id.as_str()) || putting.contains_key(r.id.as_str()) || !current(r) {
            continue;
        }
        if let Some(s) = state(&r.text) {
            // Only a state something new sets is judged again.
            if let Some(g) = groups.get_mut(&(r.namespace.clone(), s)) {
                g.push(Candidate::Known(i, when(r)));
            }
        }
    }
    let mut marked = 0;
    let mut keys: Vec<_> = groups.keys().cloned().collect();
    keys.sort();
    for key in keys {
        let Some(group) = groups.remove(&key) else {
            continue;
        };
        let Some(newest) = group.iter().max_by_key(|c| c.when()).copied() else {
            continue;
        };
        let (winner_id, winner_at) = match newest {
            Candidate::Put(i, _) => (plan.put[i].id.clone(), plan.put[i].said_at),
            Candidate::Known(i, _) => (known[i].as_ref().id.clone(), known[i].as_ref().said_at),
        };
        let valid_to = winner_at.unwrap_or(now_ms);
        for c in group {
            let target = match c {
                Candidate::Put(i, _) if plan.put[i].id != winner_id => &mut plan.put[i],
                Candidate::Known(i, _) if known[i].as_ref().id != winner_id => {
                    plan.put.push(known[i].as_ref().clone());
                    plan.updated += 1;
                    let last = plan.put.len() - 1;
                    &mut plan.put[last]
                }
                _ => continue,
            };
            target.superseded_by = Some(winner_id.clone());
            target.valid_to = Some(valid_to);
            target.updated_at = now_ms;
            marked += 1;
        }
    }
    marked
}

/// When a record was said (or else stored), for which is the newest.
fn when(r: &Record) -> (i64, i64) {
    (r.said_at.unwrap_or(r.created_at), r.updated_at)
}

#[derive(Clone, Copy)]
enum Candidate {
    Put(usize, (i64, i64)),
    Known(usize, (i64, i64)),
}

impl Candidate {
    fn when(&self) -> (i64, i64) {
        match self {
            Self::Put(_, w) | Self::Known(_, w) => *w,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_person_statement_of_a_state_is_recognised() {
        assert_eq!(state("I live in Paris"), Some("home"));
        assert_eq!(state("I moved to Berlin last week."), Some("home"));
        assert_eq!(
            state("We finally moved into our new flat in Lyon"),
            Some("home")
        );
        assert_eq!(state("I work as a nurse at the clinic"), Some("work"));
        assert_eq!(state("My name is Ada"), Some("name"));
        assert_eq!(state("I turned 30 in May"), Some("age"));
        assert_eq!(state("I'm engaged!"), Some("partner"));
        // Someone else's state, or none: not judged.
        assert_eq!(state("My sister moved to Berlin"), None);
        assert_eq!(state("I love living near the sea"), None);
        assert_eq!(state("I went to a support group yesterday"), None);
    }
}
