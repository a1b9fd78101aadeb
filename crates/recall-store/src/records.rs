//! Users' long-term memory records (`long_term::Record`), kept by user key
//! (tenant-scoped): in the backend's own place with SQLite and Redis, in
//! this process with memory storage.
//!
//! Every change to a user's records moves the user's version by one, and
//! is made only if the version is still the one the writer read
//! (compare-and-set), so that two extractions of one user, in one process
//! or in two replicas, cannot lose each other's facts. The version also
//! tells a replica whether its cached copy is current: a version is only
//! ever one content. (`recalled` is the exception: bookkeeping for
//! eviction, it changes a record's `recalled_at` without a new version.)
//!
//! Records are held in id order on every backend.

use std::collections::BTreeMap;
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::{sqlite, Storage, StorageError};
use recall_core::memory::long_term::Record;

pub(crate) mod stored;
#[cfg(test)]
mod tests;

pub use stored::Held;

type Cache = Arc<DashMap<String, Arc<Held>>>;

/// The records of users, cached in this process by user key. With memory
/// storage the cache is the store; with SQLite a cached user is current
/// (this process is the database's only writer, and every write and load
/// updates the cache under the records connection's lock); with Redis
/// each read checks the user's version first. So a process has one
/// `Records` per storage.
#[derive(Default)]
pub struct Records {
    cache: Cache,
}

impl Records {
    /// The user's records as stored now.
    pub async fn of(&self, storage: &Storage, user: &str) -> Result<Arc<Held>, StorageError> {
        match storage {
            Storage::Memory => Ok(self.cached(user).unwrap_or_default()),
            Storage::Sqlite(s) => {
                if let Some(held) = self.cached(user) {
                    return Ok(held);
                }
                let (cache, user) = (Arc::clone(&self.cache), user.to_owned());
                s.records(move |conn| {
                    // A write under this lock may have cached it meanwhile.
                    if let Some(held) = cache.get(&user) {
                        return Ok(Arc::clone(&held));
                    }
                    let held = Arc::new(sqlite::records::load(conn, &user)?);
                    make_room(&cache, &user);
                    cache.insert(user, Arc::clone(&held));
                    Ok(held)
                })
                .await
            }
            Storage::Redis(r) => {
                let version = r.records_version(user).await?;
                if let Some(held) = self.cached(user).filter(|h| h.version == version) {
                    return Ok(held);
                }
                let held = Arc::new(r.records_load(user).await?);
                make_room(&self.cache, user);
                newer(&self.cache, user, Arc::clone(&held));
                Ok(held)
            }
        }
    }

    /// Compare-and-set: if the user's records are still at `version`,
    /// inserts or replaces `put` (by id; the last of one id wins, and a
    /// record both put and removed is kept as put), removes the ids in
    /// `remove`, moves the version by one and returns true; false if the
    /// version moved meanwhile (nothing is written).
    pub async fn change(
        &self,
        storage: &Storage,
        user: &str,
        version: u64,
        put: Vec<Record>,
        remove: Vec<String>,
    ) -> Result<bool, StorageError> {
        match storage {
            Storage::Memory => {
                let mut held = self.cache.entry(user.to_owned()).or_default();
                if held.version != version {
                    return Ok(false);
                }
                *held = Arc::new(applied(&held, &put, &remove));
                Ok(true)
            }
            Storage::Sqlite(s) => {
                let (cache, user) = (Arc::clone(&self.cache), user.to_owned());
                s.records(move |conn| {
                    let done = sqlite::records::change(conn, &user, version, &put, &remove)?;
                    if done {
                        changed(&cache, &user, version, &put, &remove);
                    }
                    Ok(done)
                })
                .await
            }
            Storage::Redis(r) => {
                let done = r.records_change(user, version, &put, &remove).await?;
                if done {
                    changed(&self.cache, user, version, &put, &remove);
                }
                Ok(done)
            }
        }
    }

    /// Removes one record; whether it was there. Only a removal moves the
    /// version (nothing changed otherwise, and nobody need reload).
    pub async fn delete(
        &self,
        storage: &Storage,
        user: &str,
        id: &str,
    ) -> Result<bool, StorageError> {
        let remove = vec![id.to_owned()];
        match storage {
            Storage::Memory => {
                let Some(mut held) = self.cache.get_mut(user) else {
                    return Ok(false);
                };
                if !held.records.iter().any(|r| r.id == id) {
                    return Ok(false);
                }
                *held = Arc::new(applied(&held, &[], &remove));
                Ok(true)
            }
            Storage::Sqlite(s) => {
                let (cache, user) = (Arc::clone(&self.cache), user.to_owned());
                s.records(move |conn| {
                    let Some(version) = sqlite::records::delete(conn, &user, &remove[0])? else {
                        return Ok(false);
                    };
                    changed(&cache, &user, version.saturating_sub(1), &[], &remove);
                    Ok(true)
                })
                .await
            }
            Storage::Redis(r) => {
                let Some(version) = r.records_delete(user, id).await? else {
                    return Ok(false);
                };
                changed(&self.cache, user, version.saturating_sub(1), &[], &remove);
                Ok(true)
            }
        }
    }

    /// Removes all the user's records and says when (`forgotten_at`),
    /// moving the version; how many were removed.
    pub async fn forget(
        &self,
        storage: &Storage,
        user: &str,
        at_ms: i64,
    ) -> Result<usize, StorageError> {
        let empty = move |version| {
            Arc::new(Held {
                version,
                forgotten_at: at_ms,
                records: Vec::new(),
            })
        };
        match storage {
            Storage::Memory => {
                let mut held = self.cache.entry(user.to_owned()).or_default();
                let n = held.records.len();
                *held = empty(held.version + 1);
                Ok(n)
            }
            Storage::Sqlite(s) => {
                let (cache, user) = (Arc::clone(&self.cache), user.to_owned());
                s.records(move |conn| {
                    let (n, version) = sqlite::records::forget(conn, &user, at_ms)?;
                    cache.insert(user, empty(version));
                    Ok(n)
                })
                .await
            }
            Storage::Redis(r) => {
                let (n, version) = r.records_forget(user, at_ms).await?;
                newer(&self.cache, user, empty(version));
                Ok(n)
            }
        }
    }

    /// Sets `recalled_at = at_ms` on those of `ids` still stored, without
    /// a version check and without moving the version: bookkeeping for
    /// eviction, which must not make other replicas reload (their copies
    /// keep the older times until they reload for another reason).
    pub async fn recalled(
        &self,
        storage: &Storage,
        user: &str,
        ids: &[String],
        at_ms: i64,
    ) -> Result<(), StorageError> {
        if ids.is_empty() {
            return Ok(());
        }
        match storage {
            Storage::Memory => touched(&self.cache, user, ids, at_ms),
            Storage::Sqlite(s) => {
                let (cache, user, ids) = (Arc::clone(&self.cache), user.to_owned(), ids.to_vec());
                s.records(move |conn| {
                    sqlite::records::recalled(conn, &user, &ids, at_ms)?;
                    touched(&cache, &user, &ids, at_ms);
                    Ok(())
                })
                .await?;
            }
            Storage::Redis(r) => {
                r.records_recalled(user, ids, at_ms).await?;
                touched(&self.cache, user, ids, at_ms);
            }
        }
        Ok(())
    }

    fn cached(&self, user: &str) -> Option<Arc<Held>> {
        self.cache.get(user).map(|h| Arc::clone(&h))
    }
}

/// Users whose records a process keeps with persistent storage, at most
/// (memory storage keeps every user: the cache is its store). Another
/// user's go to make room; they are read again when next needed.
const MAX_CACHED_USERS: usize = 1000;

fn make_room(cache: &Cache, user: &str) {
    if cache.len() < MAX_CACHED_USERS {
        return;
    }
    let other = cache.iter().map(|e| e.key().clone()).find(|k| k != user);
    if let Some(other) = other {
        cache.remove(&other);
    }
}

/// `held` after a change, at the next version.
fn applied(held: &Held, put: &[Record], remove: &[String]) -> Held {
    let mut by_id: BTreeMap<&str, Arc<Record>> = held
        .records
        .iter()
        .map(|r| (r.id.as_str(), Arc::clone(r)))
        .collect();
    for id in remove {
        by_id.remove(id.as_str());
    }
    for r in put {
        by_id.insert(&r.id, Arc::new(r.clone()));
    }
    Held {
        version: held.version + 1,
        forgotten_at: held.forgotten_at,
        records: by_id.into_values().collect(),
    }
}

/// The cache after a change from `from` was stored: applied to a copy at
/// `from`, else dropped unless newer (the next read loads it).
fn changed(cache: &Cache, user: &str, from: u64, put: &[Record], remove: &[String]) {
    if let Some(mut held) = cache.get_mut(user) {
        if held.version == from {
            *held = Arc::new(applied(&held, put, remove));
            return;
        }
    }
    cache.remove_if(user, |_, held| held.version <= from);
}

/// Caches `held` unless a newer version of the user is cached (a read
/// that finished after a later write).
fn newer(cache: &Cache, user: &str, held: Arc<Held>) {
    match cache.entry(user.to_owned()) {
        Entry::Occupied(mut e) if e.get().version <= held.version => {
            e.insert(held);
        }
        Entry::Occupied(_) => {}
        Entry::Vacant(e) => {
            e.insert(held);
        }
    }
}

/// `recalled_at` set in the cached copy too, at the same version.
fn touched(cache: &Cache, user: &str, ids: &[String], at_ms: i64) {
    if let Some(mut held) = cache.get_mut(user) {
        // Records are held in id order: a search's few ids are found
        // without reading every record (each one a pointer away).
        let at: Vec<usize> = ids
            .iter()
            .filter_map(|id| {
                held.records
                    .binary_search_by(|r| r.id.as_str().cmp(id))
                    .ok()
            })
            .collect();
        if at.is_empty() {
            return;
        }
        let mut next = Held::clone(&held);
        for i in at {
            let mut r = Record::clone(&next.records[i]);
            r.recalled_at = at_ms;
            next.records[i] = Arc::new(r);
        }
        *held = Arc::new(next);
    }
}
