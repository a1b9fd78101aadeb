//! Users' carried notes (`summary::Note`), kept by user key (tenant-scoped):
//! in the backend's own place with SQLite and Redis, in this process with
//! memory storage. A deleted note is replaced by an empty one that says
//! when (`Note::forgotten`), never removed: sessions that began before
//! must not write it back.

use dashmap::DashMap;

use super::{Op, Storage, StorageError, Ticket};
use recall_core::memory::summary::Note;

/// Why a note's compare-and-set was refused.
pub(crate) const NOTE_CHANGED: &str = "the note changed since it was read";

#[derive(Default)]
pub struct Notes {
    /// With memory storage only.
    local: DashMap<String, Note>,
}

impl Notes {
    /// The user's note, read after every write queued before.
    pub async fn get(&self, storage: &Storage, user: &str) -> Result<Option<Note>, StorageError> {
        let body = match storage {
            Storage::Memory => return Ok(self.local.get(user).map(|n| n.clone())),
            Storage::Sqlite(s) => {
                storage.flush().await?;
                s.note(user).await?
            }
            Storage::Redis(r) => {
                r.flush_of(r.note_key(user)).durable().await?;
                r.note(user).await?
            }
        };
        body.map(|b| serde_json::from_str(&b))
            .transpose()
            .map_err(|e| StorageError::Corrupt(format!("note of {user}: {e}")))
    }

    pub fn put(&self, storage: &Storage, user: &str, note: &Note) -> Ticket {
        self.write(storage, user, note, None)
    }

    /// Writes `note` only if the user's note is still `before` (as `get`
    /// read it): a delete, or another session's carry-over, since is not
    /// written over. The ticket fails when it was, with a reason that
    /// `note_changed` recognises.
    pub fn put_if(
        &self,
        storage: &Storage,
        user: &str,
        note: &Note,
        before: Option<&Note>,
    ) -> Result<Ticket, StorageError> {
        let expect = match before {
            Some(n) => serde_json::to_string(n)
                .map_err(|e| StorageError::Corrupt(format!("note of {user}: {e}")))?,
            None => String::new(),
        };
        Ok(self.write(storage, user, note, Some(expect)))
    }

    fn write(&self, storage: &Storage, user: &str, note: &Note, expect: Option<String>) -> Ticket {
        if !storage.persistent() {
            let entry = self.local.entry(user.to_owned());
            let now = match &entry {
                dashmap::Entry::Occupied(o) => serde_json::to_string(o.get()).unwrap_or_default(),
                dashmap::Entry::Vacant(_) => String::new(),
            };
            if expect.is_some_and(|e| e != now) {
                return Ticket::failed(NOTE_CHANGED);
            }
            entry.insert(note.clone());
            return Ticket::ready();
        }
        let body = serde_json::to_string(note).unwrap_or_default();
        storage.submit(vec![Op::SaveNote {
            user: user.to_owned(),
            body,
            expect,
        }])
    }
}

/// Whether a failed write was a note's compare-and-set finding another
/// note, rather than storage failing.
pub fn note_changed(e: &StorageError) -> bool {
    e.to_string().contains(NOTE_CHANGED)
}
