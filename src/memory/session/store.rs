//! The map of live sessions, and the scans the sweeper makes over it.
//!
//! dashmap shards the map, so a lookup locks one shard for a moment and a
//! scan locks one shard at a time: neither stalls requests to other shards.

use std::sync::Arc;

use dashmap::DashMap;

use super::Session;
use crate::store::{Storage, StorageError};

/// Reads of a session another replica changed, before a request gives up
/// (each is lost only to a write of this replica's own meanwhile).
const RELOAD_TRIES: usize = 5;

#[derive(Default)]
pub struct Store {
    sessions: DashMap<String, Arc<Session>>,
}

impl Store {
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.get(id).map(|s| Arc::clone(&s))
    }

    /// The session, from the working set or else from storage.
    pub async fn find(
        &self,
        id: &str,
        storage: &Storage,
    ) -> Result<Option<Arc<Session>>, StorageError> {
        if let Some(s) = self.get(id) {
            if storage.needs_reload(id) && !s.is_busy() {
                return self.recover(s, storage).await;
            }
            if !storage.shared() || s.is_busy() || storage.is_fresh(id).await? {
                return Ok(Some(s));
            }
            // Another replica changed it, or ended it. A write of this
            // replica's own that lands while storage is read (a drain's late
            // update) makes what was read older than memory: read again.
            for _ in 0..RELOAD_TRIES {
                let batches = s.batches();
                match storage.load(id).await? {
                    Some(loaded) => {
                        if s.reload(loaded, batches) {
                            return Ok(Some(s));
                        }
                    }
                    None => {
                        if !s.is_busy() {
                            self.remove(&s);
                        }
                        return Ok(None);
                    }
                }
            }
            return Err(StorageError::Task(format!(
                "session {id} kept changing while it was reloaded"
            )));
        }
        let Some(loaded) = storage.load(id).await? else {
            return Ok(None);
        };
        // Another request may have loaded it meanwhile: keep the first.
        let session = self
            .sessions
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(Session::from_loaded(id, loaded)));
        Ok(Some(Arc::clone(&session)))
    }

    /// A write of `s` failed: memory may hold what storage does not. The
    /// local copy is replaced by what storage holds (read once every write
    /// queued before is done), so that what the session serves next is
    /// what a restart would find; with nothing stored, the session is
    /// dropped and the caller starts it anew.
    async fn recover(
        &self,
        s: Arc<Session>,
        storage: &Storage,
    ) -> Result<Option<Arc<Session>>, StorageError> {
        let batches = s.batches();
        let loaded = storage.load(&s.id).await?;
        if !storage.needs_reload(&s.id) {
            // Another request reloaded it meanwhile.
            return Ok(Some(s));
        }
        let gone = loaded.is_none();
        if s.recover(loaded, batches, storage) && gone {
            self.remove(&s);
            return Ok(None);
        }
        Ok(Some(s))
    }

    /// The session from the working set or storage, else a new one; and
    /// whether it was created by this call.
    pub async fn open(
        &self,
        id: &str,
        storage: &Storage,
        now_ms: i64,
    ) -> Result<(Arc<Session>, bool), StorageError> {
        match self.find(id, storage).await? {
            Some(s) => Ok((s, false)),
            None => Ok(self.get_or_create(id, now_ms)),
        }
    }

    /// The session, and whether it was created by this call.
    pub fn get_or_create(&self, id: &str, now_ms: i64) -> (Arc<Session>, bool) {
        if let Some(s) = self.get(id) {
            return (s, false);
        }
        let mut created = false;
        let session = Arc::clone(&self.sessions.entry(id.to_owned()).or_insert_with(|| {
            created = true;
            Arc::new(Session::new(id, now_ms))
        }));
        (session, created)
    }

    /// Removes exactly this session (not a newer one under the same id).
    pub fn remove(&self, session: &Arc<Session>) -> bool {
        self.sessions
            .remove_if(&session.id, |_, s| Arc::ptr_eq(s, session))
            .is_some()
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    pub fn all(&self) -> Vec<Arc<Session>> {
        self.sessions
            .iter()
            .map(|e| Arc::clone(e.value()))
            .collect()
    }

    /// Sessions idle since before `cutoff_ms`, with no reply in flight.
    pub fn idle_since(&self, cutoff_ms: i64) -> Vec<Arc<Session>> {
        let stale: Vec<Arc<Session>> = self
            .sessions
            .iter()
            .filter(|e| e.value().last_active_ms() < cutoff_ms)
            .map(|e| Arc::clone(e.value()))
            .collect();
        // Checked outside the shard locks: it takes each session's lock.
        stale.into_iter().filter(|s| !s.is_busy()).collect()
    }

    /// The `n` least recently active sessions, oldest first.
    pub fn least_active(&self, n: usize) -> Vec<Arc<Session>> {
        let mut all: Vec<(i64, Arc<Session>)> = self
            .sessions
            .iter()
            .map(|e| (e.value().last_active_ms(), Arc::clone(e.value())))
            .collect();
        let n = n.min(all.len());
        if n == 0 {
            return Vec::new();
        }
        if n < all.len() {
            all.select_nth_unstable_by_key(n - 1, |(t, _)| *t);
            all.truncate(n);
        }
        all.sort_by_key(|(t, _)| *t);
        all.into_iter().map(|(_, s)| s).collect()
    }
}
