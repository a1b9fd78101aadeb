//! The sign-in cookie, pure: made from the admin token or a client key and
//! a time, checked against them. It holds `<who>.<issued ms>.<HMAC>`, the
//! HMAC keyed by the token (a client key's digest for a tenant) over the
//! issue time: no token in it, no server state, the same on every replica,
//! void when the token changes and after `MAX_AGE_MS`.

use std::collections::HashMap;
use std::sync::Arc;

use ring::hmac;
use subtle::ConstantTimeEq;

use crate::api::auth::{Access, ClientKeys};

/// How long a sign-in lasts.
pub const MAX_AGE_MS: i64 = 7 * 24 * 3600 * 1000;
/// A cookie issued this far ahead of this process's clock (another
/// replica's) is still taken.
const SKEW_MS: i64 = 60_000;

pub struct Gate {
    admin: Option<hmac::Key>,
    /// Each client key's digest (the HMAC key of its tenant's cookies), by
    /// tenant.
    tenants: HashMap<Arc<str>, [u8; 32]>,
}

impl Gate {
    pub fn new(admin_token: Option<&str>, keys: Option<&ClientKeys>) -> Self {
        let tenants = keys
            .map(|k| {
                k.digests()
                    .map(|(digest, tenant)| (Arc::clone(tenant), *digest))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            admin: admin_token.map(|t| key(t.as_bytes())),
            tenants,
        }
    }

    /// Nothing to sign in with: the console is as open as the session API.
    pub fn open(&self) -> bool {
        self.admin.is_none() && self.tenants.is_empty()
    }

    /// The cookie a token signs in with at `now_ms`, if it is the admin
    /// token or a client key.
    pub fn login(&self, token: &str, now_ms: i64) -> Option<String> {
        let as_admin = cookie("a", &key(token.as_bytes()), now_ms);
        if self.access(&as_admin, now_ms) == Some(Access::All) {
            return Some(as_admin);
        }
        let digest = ClientKeys::digest_of(token);
        let (tenant, _) = self
            .tenants
            .iter()
            .find(|(_, known)| bool::from(known.ct_eq(&digest)))?;
        Some(cookie(&format!("t:{tenant}"), &key(&digest), now_ms))
    }

    /// Who a cookie signs in at `now_ms`, if anyone.
    pub fn access(&self, cookie: &str, now_ms: i64) -> Option<Access> {
        let (who, rest) = cookie.split_once('.')?;
        let (issued, tag) = rest.split_once('.')?;
        let issued: i64 = issued.parse().ok()?;
        let age = now_ms.checked_sub(issued)?;
        if !(-SKEW_MS..=MAX_AGE_MS).contains(&age) {
            return None;
        }
        let tag = hex::decode(tag).ok()?;
        let (k, access) = match who.strip_prefix("t:") {
            None if who == "a" => (self.admin.clone()?, Access::All),
            None => return None,
            Some(tenant) => {
                let (t, digest) = self.tenants.get_key_value(tenant)?;
                (key(digest), Access::Tenant(Arc::clone(t)))
            }
        };
        // Constant time, whatever the tag holds.
        hmac::verify(&k, signed(who, issued).as_bytes(), &tag).ok()?;
        Some(access)
    }
}

fn key(secret: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret)
}

fn signed(who: &str, issued: i64) -> String {
    format!("recall console {who} {issued}")
}

fn cookie(who: &str, k: &hmac::Key, issued: i64) -> String {
    let tag = hmac::sign(k, signed(who, issued).as_bytes());
    format!("{who}.{issued}.{}", hex::encode(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_600_000_000;

    #[test]
    fn a_token_signs_in_as_the_admin_or_a_tenant_and_the_cookie_is_not_the_token() {
        let keys = ClientKeys::from_keys(["sk-a", "sk-b"].into_iter())
            .unwrap()
            .unwrap();
        let gate = Gate::new(Some("admin-secret"), Some(&keys));
        assert!(!gate.open());
        let admin = gate.login("admin-secret", NOW).unwrap();
        assert!(!admin.contains("admin-secret"));
        assert_eq!(gate.access(&admin, NOW), Some(Access::All));
        let a = gate.login("sk-a", NOW).unwrap();
        let b = gate.login("sk-b", NOW).unwrap();
        assert!(!a.contains("sk-a"));
        let tenant = |c: &str| match gate.access(c, NOW) {
            Some(Access::Tenant(t)) => t.to_string(),
            other => panic!("{other:?}"),
        };
        assert_ne!(tenant(&a), tenant(&b));
        assert_eq!(gate.login("sk-c", NOW), None);
        assert_eq!(gate.login("", NOW), None);
        // The same token signs in on another replica.
        let again = Gate::new(Some("admin-secret"), Some(&keys));
        assert_eq!(again.access(&admin, NOW + 1000), Some(Access::All));
        assert_eq!(again.access(&a, NOW + 1000), gate.access(&a, NOW));
        // A changed token no longer does.
        assert_eq!(Gate::new(Some("rotated"), None).access(&admin, NOW), None);
        assert!(Gate::new(None, None).open());
    }

    #[test]
    fn a_cookie_expires_and_cannot_be_altered() {
        let keys = ClientKeys::from_keys(["sk-a", "sk-b"].into_iter())
            .unwrap()
            .unwrap();
        let gate = Gate::new(Some("admin-secret"), Some(&keys));
        let admin = gate.login("admin-secret", NOW).unwrap();
        assert!(gate.access(&admin, NOW + MAX_AGE_MS).is_some());
        assert_eq!(gate.access(&admin, NOW + MAX_AGE_MS + 1), None);
        assert_eq!(gate.access(&admin, NOW - SKEW_MS - 1), None);
        // A later issue time, another tenant, a changed tag: all refused.
        let later = admin.replacen(&NOW.to_string(), &(NOW + 5).to_string(), 1);
        assert_eq!(gate.access(&later, NOW + 10), None);
        let a = gate.login("sk-a", NOW).unwrap();
        let b = gate.login("sk-b", NOW).unwrap();
        let b_tenant = b.split('.').next().unwrap();
        let forged = a.replacen(a.split('.').next().unwrap(), b_tenant, 1);
        assert_eq!(gate.access(&forged, NOW), None);
        let as_admin = a.replacen(a.split('.').next().unwrap(), "a", 1);
        assert_eq!(gate.access(&as_admin, NOW), None);
        for junk in ["", "a", "a.1", "a.x.00", "a.1.zz", "t:.1.00", "é.1.00"] {
            assert_eq!(gate.access(junk, NOW), None, "{junk}");
        }
    }
}
