//! Key names. Every key of one session carries the session id as its hash
//! tag (`P:{id}:...`), so that a session's transaction touches one slot of
//! a Redis Cluster. What spans sessions (the id and activity indexes, the
//! kept webhook events and jobs) is spread over `BUCKETS` fixed buckets, each one
//! hash tag (`P:{b<n>}:...`), written by single-key commands outside any
//! session's transaction, and read by scanning every bucket.

/// How many buckets the indexes are spread over. Fixed: changing it moves
/// entries to other buckets, so it is part of the key format. 16 spreads
/// them over the masters of any usual cluster while keeping a scan of all
/// buckets cheap.
pub const BUCKETS: u32 = 16;

use crate::Kept;

#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// Hash: the session's meta and its `version`.
    pub fn meta(&self, id: &str) -> String {
        format!("{}:{{{id}}}:s", self.prefix)
    }

    /// Hash: message JSON by sequence number.
    pub fn messages(&self, id: &str) -> String {
        format!("{}:{{{id}}}:m", self.prefix)
    }

    /// Hash: by sequence number, the fields a drain learnt after a reply's
    /// record was written (`Op::SetLate`), merged into the message on load.
    pub fn late(&self, id: &str) -> String {
        format!("{}:{{{id}}}:o", self.prefix)
    }

    /// String with expiry: the replica holding the session's turn.
    pub fn lease(&self, id: &str) -> String {
        format!("{}:{{{id}}}:lease", self.prefix)
    }

    /// Set: the sessions a user spoke in (one key per user).
    pub fn user(&self, user: &str) -> String {
        format!("{}:{{u:{user}}}", self.prefix)
    }

    /// String: a user's carried note, by its key (tenant-scoped), one slot
    /// of its own.
    pub fn note(&self, user: &str) -> String {
        format!("{}:{{u:{user}}}:note", self.prefix)
    }

    /// Hash: a user's memory records, JSON without the embedding, by id.
    pub fn records(&self, user: &str) -> String {
        format!("{}:{{u:{user}}}:rec", self.prefix)
    }

    /// Hash: a user's records' embeddings, f32 little-endian, by id.
    pub fn embeddings(&self, user: &str) -> String {
        format!("{}:{{u:{user}}}:vec", self.prefix)
    }

    /// Hash: the `version` every change of a user's records moves, and
    /// `forgotten_at`, when all were last forgotten.
    pub fn records_version(&self, user: &str) -> String {
        format!("{}:{{u:{user}}}:rver", self.prefix)
    }

    /// String with expiry: the replica working on a kept event or job (the
    /// two kinds of id never meet).
    pub fn kept_claim(&self, event: &str) -> String {
        format!("{}:{{e:{event}}}:claim", self.prefix)
    }

    /// Sorted set, score 0: the ids of bucket `n`, listed in id order.
    pub fn ids(&self, n: u32) -> String {
        format!("{}:{{b{n}}}:ids", self.prefix)
    }

    /// Sorted set: the ids of bucket `n` by last activity.
    pub fn active(&self, n: u32) -> String {
        format!("{}:{{b{n}}}:active", self.prefix)
    }

    /// Hash: the kept webhook events of bucket `n`, by event id.
    pub fn undelivered(&self, n: u32) -> String {
        format!("{}:{{b{n}}}:undelivered", self.prefix)
    }

    /// Hash: recall's kept jobs of bucket `n`, by job id.
    pub fn jobs(&self, n: u32) -> String {
        format!("{}:{{b{n}}}:jobs", self.prefix)
    }

    /// The hash of bucket `n` that keeps `what`.
    pub fn kept(&self, what: Kept, n: u32) -> String {
        match what {
            Kept::Event => self.undelivered(n),
            Kept::Job => self.jobs(n),
        }
    }

    /// The channel of interrupt requests. Plain PUBLISH reaches the
    /// subscribers of every node of a cluster.
    pub fn interrupt_channel(&self) -> String {
        format!("{}:interrupt", self.prefix)
    }
}

/// The bucket of a session id or an event id: FNV-1a, stable across
/// replicas and versions (std's hasher is neither).
pub fn bucket(id: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(BUCKETS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of a key Redis Cluster hashes (its hash tag rule).
    fn tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn a_sessions_keys_share_one_tag_whatever_its_id() {
        let k = Keys::new("recall");
        for id in ["abc", "t:abc", "a}b", "a{b", "{x}", "é"] {
            let meta = k.meta(id);
            let t = tag(&meta);
            assert_eq!(t, tag(&k.messages(id)), "{id}");
            assert_eq!(t, tag(&k.lease(id)), "{id}");
        }
        assert_eq!(k.meta("abc"), "recall:{abc}:s");
    }

    #[test]
    fn a_users_keys_share_one_tag_whatever_its_key() {
        let k = Keys::new("p");
        for user in ["ada", "t:ada", "a}b", "a{b", "é"] {
            let t = tag(&k.records(user)).to_owned();
            assert_eq!(t, tag(&k.embeddings(user)), "{user}");
            assert_eq!(t, tag(&k.records_version(user)), "{user}");
            assert_eq!(t, tag(&k.note(user)), "{user}");
        }
        assert_eq!(k.records("ada"), "p:{u:ada}:rec");
    }

    #[test]
    fn a_buckets_keys_share_one_tag_and_buckets_differ() {
        let k = Keys::new("p");
        assert_eq!(tag(&k.ids(3)), tag(&k.active(3)));
        assert_eq!(tag(&k.ids(3)), tag(&k.undelivered(3)));
        assert_ne!(tag(&k.ids(3)), tag(&k.ids(4)));
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(bucket("abc"), bucket("abc"));
        let used: std::collections::HashSet<u32> =
            (0..200).map(|i| bucket(&format!("s{i}"))).collect();
        assert_eq!(used.len(), BUCKETS as usize);
        assert!(used.iter().all(|&b| b < BUCKETS));
    }
}
