//! LoCoMo conversations as the evaluation replays them: a file of one
//! conversation (as in `locomo10_v2/`) or `locomo10.json` (a list of
//! them, each with its turns under `conversation`).

use std::path::Path;

use serde_json::Value;

/// One turn: who spoke, its id (`D3:12`), what was said (a shared photo
/// described in words after it), and when (Unix ms).
#[derive(Debug, Clone)]
pub struct Turn {
    pub user: bool,
    pub id: String,
    pub text: String,
    /// The line alone, without the photo's words: what evidence is.
    pub line: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone)]
pub struct Question {
    pub question: String,
    pub answer: String,
    pub evidence: Vec<String>,
    pub category: u8,
}

#[derive(Debug, Clone)]
pub struct Conversation {
    pub name: String,
    pub sessions: Vec<Vec<Turn>>,
    pub questions: Vec<Question>,
}

impl Conversation {
    pub fn turn(&self, id: &str) -> Option<&Turn> {
        self.sessions.iter().flatten().find(|t| t.id == id)
    }

    /// Questions of categories 1 to 4 whose every evidence line the user
    /// said (what a memory of the user's words can be asked).
    pub fn asked(&self) -> Vec<&Question> {
        self.questions
            .iter()
            .filter(|q| (1..=4).contains(&q.category) && !q.evidence.is_empty())
            .filter(|q| {
                q.evidence
                    .iter()
                    .all(|e| self.turn(e).is_some_and(|t| t.user))
            })
            .collect()
    }
}

/// The conversations in `path`: a LoCoMo JSON file (one conversation or
/// the list of ten), or a directory of them.
pub fn load(path: &Path) -> Result<Vec<Conversation>, String> {
    if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        let mut out = Vec::new();
        for f in files {
            out.extend(load(&f)?);
        }
        return Ok(out);
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .map_or("conversation".into(), |s| s.to_string_lossy().into_owned());
    match v {
        Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let name = c
                    .get("sample_id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("{stem}-{i}"), str::to_owned);
                let turns = c.get("conversation").unwrap_or(c);
                conversation(&name, turns, c.get("qa"))
            })
            .collect(),
        c => Ok(vec![conversation(&stem, &c, c.get("qa"))?]),
    }
}

fn conversation(name: &str, c: &Value, qa: Option<&Value>) -> Result<Conversation, String> {
    let field = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
    let user = field("speaker_a").ok_or(format!("{name}: no speaker_a"))?;
    field("speaker_b").ok_or(format!("{name}: no speaker_b"))?;
    let mut sessions = Vec::new();
    for n in 1.. {
        let Some(Value::Array(turns)) = c.get(format!("session_{n}")) else {
            if c.get(format!("session_{}", n + 1)).is_some() {
                continue;
            }
            break;
        };
        let when = c
            .get(format!("session_{n}_date_time"))
            .and_then(Value::as_str)
            .and_then(date_ms)
            .ok_or(format!("{name}: session {n} has no date"))?;
        let mut out = Vec::new();
        for (i, t) in turns.iter().enumerate() {
            let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or_default();
            let line = s("text").trim().to_owned();
            let text = match t.get("blip_caption").and_then(Value::as_str) {
                Some(c) if !c.is_empty() => format!("{line} [shares a photo of {c}]"),
                _ => line.clone(),
            };
            out.push(Turn {
                user: s("speaker") == user,
                id: s("dia_id").to_owned(),
                text,
                line,
                at_ms: when + 30_000 * i as i64,
            });
        }
        sessions.push(out);
    }
    let questions = qa
        .and_then(Value::as_array)
        .map(|qa| qa.iter().filter_map(question).collect())
        .unwrap_or_default();
    Ok(Conversation {
        name: name.to_owned(),
        sessions,
        questions,
    })
}

fn question(q: &Value) -> Option<Question> {
    let answer = match q.get("answer")? {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let evidence = q
        .get("evidence")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        // A few ids are written together ("D8:6; D9:17").
        .flat_map(|e| e.split([';', ',']))
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect();
    Some(Question {
        question: q.get("question")?.as_str()?.to_owned(),
        answer,
        evidence,
        category: u8::try_from(q.get("category")?.as_u64()?).ok()?,
    })
}

/// `1:56 pm on 8 May, 2023` as Unix ms (UTC).
pub fn date_ms(s: &str) -> Option<i64> {
    let (time, date) = s.split_once(" on ")?;
    let (clock, half) = time.trim().split_once(' ')?;
    let (h, m) = clock.split_once(':')?;
    let (mut h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    match half.to_ascii_lowercase().as_str() {
        "pm" if h != 12 => h += 12,
        "am" if h == 12 => h = 0,
        "am" | "pm" => {}
        _ => return None,
    }
    let mut parts = date.split([' ', ',']).filter(|p| !p.is_empty());
    let day: i64 = parts.next()?.parse().ok()?;
    let name = parts.next()?;
    let month = MONTHS.iter().position(|mm| mm.eq_ignore_ascii_case(name))? as i64 + 1;
    let year: i64 = parts.next()?.parse().ok()?;
    Some((days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60) * 1000)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
