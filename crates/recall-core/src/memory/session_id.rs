//! A session's id, as a client names it.

/// Longest session id, in bytes (all its characters are ASCII).
pub const MAX_ID_LEN: usize = 128;

/// Session ids are chosen by clients, so they are checked, never defaulted.
/// They name sessions in URLs (`/v1/sessions/{id}`), storage keys and log
/// lines, so they are short and plain: 1 to 128 of `A-Z a-z 0-9 - _ . : @`,
/// and neither `.` nor anything with `..` in it, which URL clients rewrite
/// as path steps (a session so named could not be reached by its URL).
/// The message says what is wrong, without echoing a long or binary id.
pub fn validate_id(id: &str) -> Result<(), String> {
    const RULE: &str = "a session id is 1 to 128 characters of A-Z a-z 0-9 - _ . : @";
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:@".contains(c);
    if id.is_empty() {
        return Err(format!("{RULE}; this one is empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(format!("{RULE}; this one is {} bytes long", id.len()));
    }
    if let Some((at, c)) = id.char_indices().find(|&(_, c)| !ok_char(c)) {
        return Err(format!("{RULE}; this one has {c:?} at byte {at}"));
    }
    if id == "." || id.contains("..") {
        return Err(format!("{RULE}, and not `.` or anything with `..` in it"));
    }
    Ok(())
}
