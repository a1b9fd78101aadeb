//! The token count a message keeps of itself (`tokens` counts it).

use std::sync::atomic::{AtomicU32, Ordering};

/// A message's token count for the encoding it was last counted with
/// (`tokens::Encoding`, by its id, 1 to 3), in one 32-bit word so that the
/// stored message stays small: the top two bits are the id (0 = nothing
/// cached), the rest the count, which saturates (no message comes near a
/// billion tokens).
///
/// A clone starts empty: messages are cloned to be changed. Whoever changes
/// a stored message's content must `clear` it (`Message::edit` does).
#[derive(Default)]
pub(in crate::memory) struct Counted(AtomicU32);

const COUNT_BITS: u32 = 30;
const COUNT_MAX: u32 = (1 << COUNT_BITS) - 1;

impl Counted {
    pub(in crate::memory) fn get(&self, id: u32) -> Option<usize> {
        let word = self.0.load(Ordering::Relaxed);
        (word >> COUNT_BITS == id).then_some((word & COUNT_MAX) as usize)
    }

    pub(in crate::memory) fn set(&self, id: u32, count: usize) {
        let count = u32::try_from(count).unwrap_or(COUNT_MAX).min(COUNT_MAX);
        self.0.store(id << COUNT_BITS | count, Ordering::Relaxed);
    }

    pub(in crate::memory) fn clear(&mut self) {
        *self.0.get_mut() = 0;
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted::default()
    }
}

/// The cache is not part of what a message says.
impl PartialEq for Counted {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_one_count_for_one_id() {
        let c = Counted::default();
        assert_eq!(c.get(3), None);
        c.set(3, 42);
        assert_eq!(c.get(3), Some(42));
        assert_eq!(c.get(2), None);
        assert_eq!(c.get(1), None);
        assert_eq!(c.clone().get(3), None);
        c.set(1, 0);
        assert_eq!(c.get(1), Some(0));
        assert_eq!(c.get(3), None);
        c.set(2, usize::MAX);
        assert_eq!(c.get(2), Some(COUNT_MAX as usize));
    }
}
