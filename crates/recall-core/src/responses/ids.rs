//! The ids the Responses and Conversations APIs hand out. A response's
//! id names the session it is kept in (`resp_<session>_<key>`, the
//! session's id base64url-encoded as the client knows it, and the key its
//! mark holds), and an item's id names its message (`msg_<session>_<seq>_<n>`),
//! so a lookup needs no index beside the sessions: on a Redis Cluster
//! everything about a response stays in its session's slot. Ids are not
//! secrets; a tenant's ids resolve only among its own sessions.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SecureRandom;
use std::cell::RefCell;
use std::fmt::Write;

/// `n` (at most 16) random bytes as hex. The system's randomness is
/// drawn half a kilobyte at a time per thread: a `getrandom` call for
/// every id cost a system call per response. Should that randomness fail
/// (never on Linux), the clock and a counter keep ids unique.
fn random_hex(n: usize) -> String {
    const DRAWN: usize = 512;
    struct Pool {
        bytes: [u8; DRAWN],
        next: usize,
    }
    thread_local! {
        static POOL: RefCell<Pool> = const { RefCell::new(Pool { bytes: [0; DRAWN], next: DRAWN }) };
    }
    debug_assert!(n <= 16, "the fallback gives 16 bytes");
    let draw = |cell: &RefCell<Pool>| {
        let mut pool = cell.borrow_mut();
        if pool.next + n > DRAWN {
            ring::rand::SystemRandom::new().fill(&mut pool.bytes).ok()?;
            pool.next = 0;
        }
        let at = pool.next;
        let bytes = pool.bytes.get(at..at + n).map(hex::encode)?;
        pool.next += n;
        Some(bytes)
    };
    // `try_with`: a thread's locals may be gone while it shuts down.
    let drawn = POOL.try_with(draw).ok().flatten();
    drawn.unwrap_or_else(|| {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let at = crate::clock::now_ms() as u64;
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The counter mixed into the first eight bytes: a key takes only those.
        let mut bytes = [(at ^ k.rotate_left(40)).to_be_bytes(), k.to_be_bytes()].concat();
        bytes.truncate(n);
        hex::encode(bytes)
    })
}

/// A new session's id for a response chain (`chain_...`) or a
/// conversation (`conv_...`).
pub fn new_session(kind: &str) -> String {
    format!("{kind}_{}", random_hex(12))
}

/// A response's key within its session.
pub fn new_key() -> String {
    random_hex(8)
}

// The ids below are written into one string sized for them: `format!`
// with an encoded argument grew its string twice or three times and
// allocated the encoding apart, a microsecond a response.

pub fn response(session: &str, key: &str) -> String {
    let mut id = String::with_capacity(6 + encoded_len(session) + key.len());
    id.push_str("resp_");
    URL_SAFE_NO_PAD.encode_string(session, &mut id);
    id.push('_');
    id.push_str(key);
    id
}

fn encoded_len(session: &str) -> usize {
    session.len().div_ceil(3) * 4
}

/// The session (as the client knows it) and key a response id names.
pub fn parse_response(id: &str) -> Option<(String, &str)> {
    let (session, key) = id.strip_prefix("resp_")?.rsplit_once('_')?;
    Some((decode(session)?, key))
}

/// What item ids of the message at `seq` start with.
pub fn items_base(session: &str, seq: u64) -> String {
    let mut id = String::with_capacity(encoded_len(session) + 21);
    URL_SAFE_NO_PAD.encode_string(session, &mut id);
    let _ = write!(id, "_{seq}");
    id
}

pub fn item(kind: &str, base: &str, n: usize) -> String {
    let mut id = String::with_capacity(kind.len() + base.len() + 22);
    id.push_str(kind);
    id.push('_');
    id.push_str(base);
    let _ = write!(id, "_{n}");
    id
}

/// The session, sequence number and part an item id names.
pub fn parse_item(id: &str) -> Option<(String, u64, usize)> {
    let (_, rest) = id.split_once('_')?;
    let (rest, n) = rest.rsplit_once('_')?;
    let (session, seq) = rest.rsplit_once('_')?;
    Some((decode(session)?, seq.parse().ok()?, n.parse().ok()?))
}

fn decode(b64: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(b64).ok()?;
    let id = String::from_utf8(bytes).ok()?;
    crate::memory::session_id::validate_id(&id).ok()?;
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_session_and_read_back() {
        let id = response("a_b-c:d@e", "00ff");
        assert!(id.starts_with("resp_"));
        assert_eq!(parse_response(&id), Some(("a_b-c:d@e".into(), "00ff")));
        let item = item("fc", &items_base("conv_1", 42), 3);
        assert_eq!(parse_item(&item), Some(("conv_1".into(), 42, 3)));
        assert_eq!(parse_response("resp_!!_1"), None);
        assert_eq!(parse_item("msg_x"), None);
        assert_ne!(new_session("chain"), new_session("chain"));
        assert_eq!(new_key().len(), 16);
        // Drawn from one pool: no two alike across many refills of it.
        let keys: std::collections::HashSet<String> = (0..10_000).map(|_| new_key()).collect();
        assert_eq!(keys.len(), 10_000);
    }
}
