//! What storage keeps until it is done with: webhook events until they
//! are delivered, recall's own jobs (a carry-over) until they have run.
//! Kept in the same write as what they come from, so that a stop loses
//! neither; taken under a claim, so that one replica at a time works on
//! each.

use std::time::Duration;

use super::{redis, Kept, Storage, StorageError};

/// The right to work on a kept event or job: with shared storage, a lease
/// on it, renewed while held, that lapses if this process dies; with a
/// process of its own, nothing.
#[derive(Debug)]
pub struct KeptClaim(Option<redis::Lease>);

impl KeptClaim {
    /// Whether the claim lapsed and another replica may be working on it
    /// now.
    pub fn lost(&self) -> bool {
        self.0.as_ref().is_some_and(redis::Lease::lost)
    }
}

/// A kept event or job, taken: its body as stored, read under the claim.
#[derive(Debug)]
pub struct Taken {
    pub claim: KeptClaim,
    pub body: String,
}

/// Shortest and longest wait before looking again at what another replica
/// holds.
const CLAIM_POLL_MIN: Duration = Duration::from_millis(50);
const CLAIM_POLL_MAX: Duration = Duration::from_secs(5);

impl Storage {
    /// Webhook events kept undelivered: their ids and bodies.
    pub async fn kept_events(&self) -> Result<Vec<(String, String)>, StorageError> {
        self.kept(Kept::Event).await
    }

    /// What is kept of `what`: ids and bodies, in id order. Waits for
    /// queued writes first, so that what was kept a moment ago is found.
    pub async fn kept(&self, what: Kept) -> Result<Vec<(String, String)>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(Vec::new()),
            Storage::Sqlite(s) => s.kept(what).await,
            Storage::Redis(r) => r.kept(what).await,
        }
    }

    /// One kept event's or job's body, if it is still kept.
    pub async fn kept_one(&self, what: Kept, id: &str) -> Result<Option<String>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(None),
            Storage::Sqlite(s) => s.kept_one(what, id).await,
            Storage::Redis(r) => r.kept_one(what, id).await,
        }
    }

    /// Claims the kept `id` and reads it under the claim. While another
    /// replica holds it, waits until that one is done with it (`None`:
    /// nothing left to do) or lets go (a replica that died). `None` too
    /// when it is no longer kept.
    pub async fn take_kept(&self, what: Kept, id: &str) -> Result<Option<Taken>, StorageError> {
        let claim = loop {
            match self {
                Storage::Redis(r) => match r.claim_kept(id).await? {
                    Ok(lease) => break KeptClaim(Some(lease)),
                    Err(left) => {
                        tokio::time::sleep(left.clamp(CLAIM_POLL_MIN, CLAIM_POLL_MAX)).await;
                        if self.kept_one(what, id).await?.is_none() {
                            return Ok(None);
                        }
                    }
                },
                // One process per store: its own bookkeeping keeps it from
                // working on one twice at once.
                _ => break KeptClaim(None),
            }
        };
        // Read under the claim: what an earlier holder finished is gone.
        match self.kept_one(what, id).await {
            Ok(Some(body)) => Ok(Some(Taken { claim, body })),
            other => {
                let _ = self.release_kept(claim).await;
                other.map(|_| None)
            }
        }
    }

    /// Gives up a claim (after what it was on was forgotten, if it is
    /// done, so that nobody who claims it next finds it kept).
    pub async fn release_kept(&self, claim: KeptClaim) -> Result<(), StorageError> {
        match (self, claim.0) {
            (Storage::Redis(r), Some(lease)) => r.release_kept(lease).await,
            _ => Ok(()),
        }
    }
}
