//! Who may use recall, and whose sessions they see.
//!
//! With `[auth] api_keys_env` (or `api_keys_file`) set, every chat request
//! needs one of the configured client keys as a bearer token, and each key
//! is a tenant: a session id names a session within the caller's tenant,
//! kept internally as `<tenant>:<id>` where the tenant is derived from the
//! key. The same id under two keys is two sessions; neither key can reach
//! the other's. The admin token sees every tenant's sessions under their
//! internal ids.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::config::AuthConfig;

/// The configured client keys, by the SHA-256 of each: a lookup by digest
/// reveals nothing about a key's bytes through its timing.
pub struct ClientKeys {
    tenants: HashMap<[u8; 32], Arc<str>>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KeysError {
    #[error("auth.api_keys_env names `{0}`, which is not set")]
    UnsetVariable(String),
    #[error("auth.api_keys_file `{path}` cannot be read: {reason}")]
    File { path: String, reason: String },
    #[error("auth is configured but holds no keys")]
    Empty,
}

impl ClientKeys {
    /// The keys, or `None` when auth is not configured. Configured but
    /// missing or empty is an error: recall does not start open by mistake.
    pub fn load(config: &AuthConfig) -> Result<Option<Self>, KeysError> {
        if config.api_keys_env.is_none() && config.api_keys_file.is_none() {
            return Ok(None);
        }
        let mut keys = Vec::new();
        if let Some(var) = &config.api_keys_env {
            let value = std::env::var(var).map_err(|_| KeysError::UnsetVariable(var.clone()))?;
            keys.extend(value.split(',').map(str::to_owned));
        }
        if let Some(path) = &config.api_keys_file {
            let text = std::fs::read_to_string(path).map_err(|e| KeysError::File {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            keys.extend(
                text.lines()
                    .filter(|l| !l.trim_start().starts_with('#'))
                    .map(str::to_owned),
            );
        }
        Self::from_keys(keys.iter().map(|k| k.trim()))
    }

    pub fn from_keys<'a>(keys: impl Iterator<Item = &'a str>) -> Result<Option<Self>, KeysError> {
        let tenants: HashMap<[u8; 32], Arc<str>> = keys
            .filter(|k| !k.is_empty())
            .map(|k| {
                let digest = digest(k);
                let tenant = hex::encode(&digest[..8]);
                (digest, Arc::from(tenant))
            })
            .collect();
        if tenants.is_empty() {
            return Err(KeysError::Empty);
        }
        Ok(Some(Self { tenants }))
    }

    /// The tenant of the bearer key in `headers`, if it is a client key.
    pub fn tenant(&self, headers: &HeaderMap) -> Option<Arc<str>> {
        let key = bearer(headers)?;
        let digest = digest(key);
        // The map finds the candidate; the compare is constant-time anyway.
        let (known, tenant) = self.tenants.get_key_value(&digest)?;
        bool::from(known.ct_eq(&digest)).then(|| Arc::clone(tenant))
    }
}

impl ClientKeys {
    /// Each key's digest and tenant (the console derives its cookies from
    /// the digests, never from the keys).
    pub fn digests(&self) -> impl Iterator<Item = (&[u8; 32], &Arc<str>)> {
        self.tenants.iter()
    }

    pub fn digest_of(key: &str) -> [u8; 32] {
        digest(key)
    }
}

fn digest(key: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Which sessions a caller may reach.
#[derive(Clone, Debug, PartialEq)]
pub enum Access {
    /// Every session, by its internal id (no client keys, or the admin).
    All,
    /// The sessions of one client key.
    Tenant(Arc<str>),
}

impl Access {
    /// The internal id of the session a caller names `id`.
    pub fn internal<'a>(&self, id: &'a str) -> Cow<'a, str> {
        match self {
            Access::All => Cow::Borrowed(id),
            Access::Tenant(t) => Cow::Owned(format!("{t}:{id}")),
        }
    }

    /// The id a caller knows an internal id by, or `None` when the session
    /// is not theirs.
    pub fn show<'a>(&self, internal: &'a str) -> Option<&'a str> {
        match self {
            Access::All => Some(internal),
            Access::Tenant(t) => internal.strip_prefix(&**t)?.strip_prefix(':'),
        }
    }

    /// The caller's partition of shared state such as the answer cache.
    pub fn partition(&self) -> &str {
        match self {
            Access::All => "",
            Access::Tenant(t) => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_key(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        h
    }

    #[test]
    fn each_key_is_a_tenant_and_unknown_keys_are_none() {
        let keys = ClientKeys::from_keys(["k-one", " ", "k-two"].into_iter())
            .unwrap()
            .unwrap();
        let one = keys.tenant(&with_key("k-one")).unwrap();
        let two = keys.tenant(&with_key("k-two")).unwrap();
        assert_ne!(one, two);
        assert_eq!(one.len(), 16);
        assert!(keys.tenant(&with_key("k-three")).is_none());
        assert!(keys.tenant(&HeaderMap::new()).is_none());
        assert_eq!(
            ClientKeys::from_keys([""].into_iter()).err(),
            Some(KeysError::Empty)
        );
    }

    #[test]
    fn a_tenant_sees_only_its_own_ids() {
        let a = Access::Tenant(Arc::from("aaaa"));
        let internal = a.internal("s1").into_owned();
        assert_eq!(internal, "aaaa:s1");
        assert_eq!(a.show(&internal), Some("s1"));
        assert_eq!(a.show("bbbb:s1"), None);
        assert_eq!(a.show("aaaab:s1"), None);
        assert_eq!(Access::All.show("bbbb:s1"), Some("bbbb:s1"));
        assert_eq!(Access::All.internal("x"), "x");
    }
}
