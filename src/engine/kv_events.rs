//! KV cache events: what the block manager tells the outside world about its prefix cache, in
//! vLLM's vocabulary (a block got its hash and can be reused; a hashed block left the cache;
//! the whole cache was cleared). Prefix-aware routers (vllm-router's `kv_aware`, llm-d) index
//! them to send a request to the worker already holding its prefix.
//!
//! The block manager queues events as it works; the engine thread hands each step's events to
//! a [`KvEventSink`], whose bounded queue never blocks the engine: when the consumer (the
//! publisher thread in `crate::server::kv_publisher`) falls behind, the batch is dropped and counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::block_manager::BlockHash;

/// One change to the prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// A contiguous chain of full blocks got their hashes: `block_hashes[i]` holds
    /// `token_ids[i * block_size..(i + 1) * block_size]`; the first block follows the block
    /// whose hash is `parent_block_hash` (None: the chain starts the sequence).
    BlockStored {
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
    },
    /// These hashed blocks were evicted: their prefix is no longer cached.
    BlockRemoved { block_hashes: Vec<BlockHash> },
    /// Every cached block is gone (sent at start).
    AllBlocksCleared,
}

/// Batches of events waiting in the sink's queue before it drops new ones.
pub const KV_EVENT_QUEUE_BATCHES: usize = 1024;

/// The engine's end of the event queue: cheap to clone, never blocks.
#[derive(Clone, Debug)]
pub struct KvEventSink {
    tx: mpsc::Sender<Vec<KvCacheEvent>>,
    dropped: Arc<AtomicU64>,
}

impl KvEventSink {
    /// A sink and the receiver its batches arrive on.
    pub fn new(capacity: usize) -> (KvEventSink, mpsc::Receiver<Vec<KvCacheEvent>>) {
        let (tx, rx) = mpsc::channel(capacity);
        let sink = KvEventSink {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        (sink, rx)
    }

    /// Queues one batch, or drops it (counted) when the queue is full or nobody reads it.
    pub fn send(&self, events: Vec<KvCacheEvent>) {
        if events.is_empty() {
            return;
        }
        if self.tx.try_send(events).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a batch dropped further down (e.g. by the publisher), so one counter tells all.
    pub fn count_dropped(&self, batches: u64) {
        self.dropped.fetch_add(batches, Ordering::Relaxed);
    }

    /// Batches dropped so far.
    pub fn num_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Merges neighbouring removals into one event, so an eviction burst is one event per run.
pub fn coalesce(events: Vec<KvCacheEvent>) -> Vec<KvCacheEvent> {
    let mut out: Vec<KvCacheEvent> = Vec::with_capacity(events.len());
    for e in events {
        if let (
            Some(KvCacheEvent::BlockRemoved { block_hashes: prev }),
            KvCacheEvent::BlockRemoved { block_hashes },
        ) = (out.last_mut(), &e)
        {
            prev.extend_from_slice(block_hashes);
            continue;
        }
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (sink, mut rx) = KvEventSink::new(1);
        sink.send(vec![KvCacheEvent::AllBlocksCleared]);
        sink.send(vec![KvCacheEvent::AllBlocksCleared]);
        sink.send(vec![]); // nothing to send: not a drop
        assert_eq!(sink.num_dropped(), 1);
        assert_eq!(rx.try_recv().unwrap(), vec![KvCacheEvent::AllBlocksCleared]);
        drop(rx);
        sink.send(vec![KvCacheEvent::AllBlocksCleared]);
        assert_eq!(sink.num_dropped(), 2);
    }

    #[test]
    fn neighbouring_removals_merge() {
        let removed = |h: Vec<u64>| KvCacheEvent::BlockRemoved { block_hashes: h };
        let stored = KvCacheEvent::BlockStored {
            block_hashes: vec![9],
            parent_block_hash: None,
            token_ids: vec![1],
        };
        let out = coalesce(vec![
            removed(vec![1]),
            removed(vec![2, 3]),
            stored.clone(),
            removed(vec![4]),
        ]);
        assert_eq!(out, vec![removed(vec![1, 2, 3]), stored, removed(vec![4])]);
    }
}
