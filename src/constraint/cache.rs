//! The compiled-grammar cache, bounded by memory: each entry is charged an estimate of what its
//! compiled grammar holds (llguidance's lexer and parser tables grow with the source: about 26
//! bytes resident per byte of a large enum schema, measured), and the least recently used
//! entries go when a new one would pass the budget (`--grammar-cache-mib`). A grammar larger
//! than the whole budget is compiled for its request and not kept.

use std::collections::HashMap;

/// Bytes charged per byte of grammar source (above the measured 26, for the state the matcher
/// builds as it runs).
const BYTES_PER_SOURCE_BYTE: usize = 32;
/// Bytes charged per entry whatever its size (the matcher's fixed tables).
const BYTES_PER_ENTRY: usize = 64 << 10;
/// The budget when none is set: 128 MiB.
pub const DEFAULT_BUDGET: usize = 128 << 20;

/// An entry's key: the grammar source's hash and the tenant (an API key's salt).
pub type Key = (u64, Option<u64>);

struct Entry<V> {
    value: V,
    cost: usize,
    /// When it was last used (a counter).
    used: u64,
}

/// Compiled grammars (`V`: a `Constraint`) by key.
pub struct GrammarCache<V> {
    entries: HashMap<Key, Entry<V>>,
    bytes: usize,
    budget: usize,
    clock: u64,
}

impl<V: Clone> GrammarCache<V> {
    pub fn new(budget: usize) -> Self {
        GrammarCache {
            entries: HashMap::new(),
            bytes: 0,
            budget,
            clock: 0,
        }
    }

    /// What an entry of `source_len` bytes of source is charged.
    pub fn cost_of(source_len: usize) -> usize {
        source_len
            .saturating_mul(BYTES_PER_SOURCE_BYTE)
            .saturating_add(BYTES_PER_ENTRY)
    }

    pub fn get(&mut self, key: &Key) -> Option<V> {
        self.clock += 1;
        let e = self.entries.get_mut(key)?;
        e.used = self.clock;
        Some(e.value.clone())
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    /// Keeps `value` (compiled from `source_len` bytes), making room by evicting the least
    /// recently used; not kept when it alone passes the budget.
    pub fn insert(&mut self, key: Key, value: V, source_len: usize) {
        let cost = Self::cost_of(source_len);
        if cost > self.budget {
            return;
        }
        if let Some(old) = self.entries.remove(&key) {
            self.bytes -= old.cost;
        }
        self.shrink_to(self.budget - cost);
        self.clock += 1;
        self.bytes += cost;
        let used = self.clock;
        self.entries.insert(key, Entry { value, cost, used });
    }

    /// Changes the budget, evicting what no longer fits.
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.shrink_to(budget);
    }

    /// Evicts the least recently used entries until at most `limit` bytes are charged.
    fn shrink_to(&mut self, limit: usize) {
        while self.bytes > limit {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.cost;
            }
        }
    }

    /// Bytes charged for what is kept, and how many entries.
    pub fn usage(&self) -> (usize, usize) {
        (self.bytes, self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_when_the_budget_is_passed() {
        let one = GrammarCache::<u32>::cost_of(1000);
        let mut c = GrammarCache::new(3 * one);
        for k in 0..3u64 {
            c.insert((k, None), k as u32, 1000);
        }
        assert_eq!(c.usage(), (3 * one, 3));
        assert_eq!(c.get(&(0, None)), Some(0));
        c.insert((3, None), 3, 1000);
        // Key 1 was the least recently used.
        assert!(c.contains(&(0, None)) && !c.contains(&(1, None)));
        assert_eq!(c.usage().1, 3);
        // Another tenant's entry is another entry.
        assert_eq!(c.get(&(0, Some(7))), None);
        // Too large for the whole budget: not kept, nothing evicted.
        c.insert((9, None), 9, 10 * 1000);
        assert!(!c.contains(&(9, None)));
        assert_eq!(c.usage().1, 3);
        c.set_budget(one);
        assert_eq!(c.usage(), (one, 1));
        assert!(c.contains(&(3, None)));
    }
}
