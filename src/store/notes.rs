//! Users' carried notes (`summary::Note`), kept by user key (tenant-scoped):
//! in the backend's own place with SQLite and Redis, in this process with
//! memory storage. A deleted note is replaced by an empty one that says
//! when (`Note::forgotten`), never removed: sessions that began before
//! must not write it back.

use dashmap::DashMap;

use super::{Op, Storage, StorageError, Ticket};
use crate::memory::summary::Note;

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
        if !storage.persistent() {
            self.local.insert(user.to_owned(), note.clone());
            return Ticket::ready();
        }
        let body = serde_json::to_string(note).unwrap_or_default();
        storage.submit(vec![Op::SaveNote {
            user: user.to_owned(),
            body,
        }])
    }
}
