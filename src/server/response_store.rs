//! The Responses API's store: responses kept in memory (when `store` is not false) with their
//! conversation (the chat messages that ran, and the reply), so `previous_response_id` can
//! continue one and `GET`/`DELETE /v1/responses/{id}` find it. Bounded by age and by count
//! (the oldest go first), and kept apart per API key: another key's id is not found. Owned by
//! `AppState`; used by `responses`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a response is kept.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// How many responses are kept at most.
pub const MAX_ENTRIES: usize = 1000;

/// One kept response.
#[derive(Clone, Debug)]
pub struct Stored {
    pub response: Value,
    /// The conversation so far, as chat messages (without `instructions`).
    pub conversation: Vec<Value>,
}

struct Entry {
    owner: Option<u64>,
    at: Instant,
    stored: Stored,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Ids oldest first (some may be gone already).
    order: VecDeque<String>,
}

pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_age: Duration,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(MAX_ENTRIES, MAX_AGE)
    }
}

impl ResponseStore {
    pub fn new(max_entries: usize, max_age: Duration) -> Self {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            max_entries,
            max_age,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `stored` as `id` for `owner` (an API key's salt).
    pub fn insert(&self, id: &str, owner: Option<u64>, stored: Stored) {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.map.insert(
            id.to_string(),
            Entry {
                owner,
                at: now,
                stored,
            },
        );
        inner.order.push_back(id.to_string());
        while let Some(oldest) = inner.order.front().cloned() {
            let expired = inner
                .map
                .get(&oldest)
                .is_none_or(|e| now.duration_since(e.at) > self.max_age);
            if !expired && inner.map.len() <= self.max_entries {
                break;
            }
            inner.order.pop_front();
            inner.map.remove(&oldest);
        }
    }

    /// The response `id` of `owner`, if kept and not too old.
    pub fn get(&self, id: &str, owner: Option<u64>) -> Option<Stored> {
        let inner = self.lock();
        inner
            .map
            .get(id)
            .filter(|e| e.owner == owner && e.at.elapsed() <= self.max_age)
            .map(|e| e.stored.clone())
    }

    /// Forgets the response `id` of `owner`; whether it was kept.
    pub fn remove(&self, id: &str, owner: Option<u64>) -> bool {
        let mut inner = self.lock();
        if inner.map.get(id).is_some_and(|e| e.owner == owner) {
            inner.map.remove(id);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(n: u64) -> Stored {
        Stored {
            response: json!({ "n": n }),
            conversation: Vec::new(),
        }
    }

    #[test]
    fn kept_per_owner_and_bounded() {
        let s = ResponseStore::new(2, Duration::from_secs(60));
        s.insert("a", Some(1), stored(1));
        assert!(s.get("a", Some(2)).is_none());
        assert!(s.get("a", None).is_none());
        assert_eq!(s.get("a", Some(1)).unwrap().response["n"], 1);
        s.insert("b", Some(1), stored(2));
        s.insert("c", Some(1), stored(3));
        assert!(s.get("a", Some(1)).is_none(), "the oldest goes first");
        assert!(!s.remove("b", Some(2)));
        assert!(s.remove("b", Some(1)));
        assert!(s.get("b", Some(1)).is_none());
        let s = ResponseStore::new(10, Duration::ZERO);
        s.insert("a", None, stored(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(s.get("a", None).is_none(), "too old");
    }
}
