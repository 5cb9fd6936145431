//! A poisoned lock's recovery, written once.
//!
//! A panic while a lock is held poisons it. Every lock in Hourglass guards
//! data that each holder leaves consistent between its own steps (a map
//! updated in one call, a counter), so the data is still good: recover it
//! rather than turn one panicked task into a panic in every later caller.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`] that takes the data back from a poisoned lock.
pub trait LockExt<T: ?Sized> {
    /// The guard, whether or not an earlier holder panicked.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_gives_its_data_back() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *m.lock_unpoisoned() += 1;
        assert_eq!(*m.lock_unpoisoned(), 2);
    }
}
