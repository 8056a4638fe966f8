//! The block manager's KV events alone, without a model: one `BlockStored` per chain entering
//! the prefix cache (parent hash, tokens), nothing for a block the cache already holds, a
//! `BlockRemoved` of the stored hash when it is evicted, and a random run where the events
//! replayed into a set equal the cache's contents (what a router's index would hold). For a
//! model with recurrent layers (a scheduler with state slots), a chain is announced only as far
//! as a state snapshot reaches, and only announced blocks are removed.

mod support;

use std::collections::HashSet;

use edge_llm::engine::block_manager::{BlockId, BlockManager};
use edge_llm::engine::kv_events::KvCacheEvent;
use edge_llm::engine::scheduler::{Scheduler, SchedulerConfig};
use edge_llm::engine::sequence::SeqId;
use edge_llm::engine::state_slots::StateSlots;
use support::splitmix::Rng;

fn stored(e: &KvCacheEvent) -> (&[u64], Option<u64>, &[u32]) {
    match e {
        KvCacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
        } => (block_hashes, *parent_block_hash, token_ids),
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

#[test]
fn off_unless_enabled() {
    let mut m = BlockManager::new(4, 4, 0);
    let mut t = Vec::new();
    m.allocate(&mut t, 0, 8).unwrap();
    m.register_full_blocks(&t, &(0..8).collect::<Vec<u32>>(), 8);
    assert!(m.take_events().is_empty());
}

#[test]
fn chains_are_stored_once_and_evictions_remove_their_hashes() {
    let mut m = BlockManager::new(4, 4, 7);
    m.enable_events();
    let prompt: Vec<u32> = (100..110).collect();
    let mut a = Vec::new();
    m.allocate(&mut a, 0, 10).unwrap();
    // Two steps of prefill: 4 tokens, then 10 (blocks 0, then 1).
    m.register_full_blocks(&a, &prompt, 4);
    m.register_full_blocks(&a, &prompt, 10);
    let events = m.take_events();
    assert_eq!(events.len(), 2, "{events:?}");
    let (h0, p0, t0) = stored(&events[0]);
    assert_eq!((h0.len(), p0, t0), (1, None, &prompt[..4]));
    let (h1, p1, t1) = stored(&events[1]);
    assert_eq!((h1.len(), p1, t1), (1, Some(h0[0]), &prompt[4..8]));
    let hashes = [h0[0], h1[0]];
    assert_eq!(m.prompt_block_hashes(&prompt), hashes.to_vec());
    // The same prompt computed by a second sequence at the same time: the cache keeps the
    // first block for each hash, and nothing is announced twice.
    let mut b: Vec<BlockId> = Vec::new();
    m.free(&mut a);
    let mut c = m.match_prefix(&prompt);
    assert_eq!(c.len(), 2);
    m.allocate(&mut c, 8, 10).unwrap();
    m.register_full_blocks(&c, &prompt, 10);
    assert!(m.take_events().is_empty(), "cached blocks announced again");
    // Fill the pool with other tokens: the free cached blocks are evicted (LRU: the tail first,
    // as `free` released it first), and their hashes are removed.
    m.free(&mut c);
    let other: Vec<u32> = (500..516).collect();
    m.allocate(&mut b, 0, 16).unwrap();
    m.register_full_blocks(&b, &other, 16);
    let events = m.take_events();
    let mut removed: Vec<u64> = Vec::new();
    let mut new_chain = Vec::new();
    for e in &events {
        match e {
            KvCacheEvent::BlockRemoved { block_hashes } => removed.extend(block_hashes),
            KvCacheEvent::BlockStored { .. } => new_chain.push(stored(e)),
            KvCacheEvent::AllBlocksCleared => panic!("not from the block manager"),
        }
    }
    removed.sort();
    let mut want = hashes.to_vec();
    want.sort();
    assert_eq!(removed, want);
    assert_eq!(new_chain.len(), 1, "one event for the 4-block chain");
    assert_eq!(new_chain[0].0.len(), 4);
    assert_eq!(new_chain[0].2, &other[..]);
}

#[test]
fn replayed_events_equal_the_cache_contents() {
    let mut rng = Rng(0x1234_5678);
    let mut next = |n: usize| rng.below(n);
    let bs = 4;
    let mut m = BlockManager::new(24, bs, 1);
    m.enable_events();
    let mut index: HashSet<u64> = HashSet::new();
    let mut tables: Vec<(Vec<BlockId>, Vec<u32>)> = Vec::new();
    let (mut num_stored, mut num_removed) = (0, 0);
    for _ in 0..2000 {
        if tables.len() < 4 && next(2) == 0 {
            // A prompt from a few shared prefixes, so hits and duplicates happen.
            let prefix = next(3) as u32;
            let len = 2 + next(20);
            let tokens: Vec<u32> = (0..len as u32)
                .map(|i| prefix * 1000 + i % (4 + prefix))
                .collect();
            let mut table = m.match_prefix(&tokens);
            let computed = table.len() * bs;
            if m.allocate(&mut table, computed, len).is_some() {
                m.register_full_blocks(&table, &tokens, len);
                tables.push((table, tokens));
            } else {
                m.free(&mut table);
            }
        } else if !tables.is_empty() {
            let k = next(tables.len());
            let (mut table, _) = tables.swap_remove(k);
            m.free(&mut table);
        }
        for e in m.take_events() {
            match e {
                KvCacheEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    ..
                } => {
                    assert_eq!(token_ids.len(), block_hashes.len() * bs);
                    for h in block_hashes {
                        num_stored += 1;
                        assert!(index.insert(h), "hash {h:x} stored twice");
                    }
                }
                KvCacheEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        num_removed += 1;
                        assert!(index.remove(&h), "hash {h:x} removed but never stored");
                    }
                }
                KvCacheEvent::AllBlocksCleared => unreachable!(),
            }
        }
        // What a router replaying the events holds is exactly what the cache can serve.
        let cached: HashSet<u64> = m.cached_hashes().collect();
        assert_eq!(index, cached);
        let refs: Vec<&[BlockId]> = tables.iter().map(|(t, _)| t.as_slice()).collect();
        m.check_invariants(refs).unwrap();
    }
    // The run stored and evicted plenty (it is not vacuous).
    assert!(
        num_stored > 100 && num_removed > 50,
        "{num_stored} stored, {num_removed} removed"
    );
}

#[test]
fn a_hybrid_models_blocks_are_announced_only_as_far_as_a_state_snapshot_reaches() {
    let bs = 4;
    let mut blocks = BlockManager::new(16, bs, 3);
    blocks.enable_events();
    blocks.announce_at_snapshots();
    let config = SchedulerConfig {
        max_batched_tokens: 64,
        max_seqs: 4,
    };
    let mut s = Scheduler::new(config, blocks);
    s.states = StateSlots::new(2);
    s.snapshot_every = 0; // a snapshot at a prompt's last full block only
                          // 14 tokens: its prompt blocks are the first three, its snapshot at token 12.
    let prompt: Vec<u32> = (100..114).collect();
    let id = SeqId(1);
    s.add(id, prompt.clone());
    let out = s.schedule();
    assert_eq!(out.scheduled, [(id, 12)], "the chunk cut at the snapshot");
    s.step_done(&out);
    let events = s.blocks.take_events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (announced, parent, tokens) = stored(&events[0]);
    assert_eq!((parent, tokens), (None, &prompt[..12]));
    assert_eq!(announced, &s.blocks.prompt_block_hashes(&prompt)[..]);
    let announced = announced.to_vec();
    // The prompt's last tokens, then six generated: two more full blocks, no snapshot on them.
    let out = s.schedule();
    s.step_done(&out);
    for t in 0..6 {
        s.append_token(id, 900 + t);
        let out = s.schedule();
        s.step_done(&out);
    }
    assert_eq!(s.get(id).unwrap().num_computed, 20);
    assert!(s.blocks.is_cached(
        s.blocks
            .registered(s.get(id).unwrap().block_table[4])
            .unwrap()
            .0
    ));
    assert!(
        s.blocks.take_events().is_empty(),
        "blocks past the snapshot announced"
    );
    s.finish(id);
    // A 66-token prompt takes the whole pool (its snapshot at 64): of the five cached blocks,
    // only the three announced are removed; its own 16 blocks are stored as one chain.
    s.add(SeqId(2), (500..566).collect());
    let out = s.schedule();
    assert_eq!(out.scheduled, [(SeqId(2), 64)]);
    s.step_done(&out);
    let (mut removed, mut chains) = (Vec::new(), Vec::new());
    for e in s.blocks.take_events() {
        match e {
            KvCacheEvent::BlockRemoved { block_hashes } => removed.extend(block_hashes),
            KvCacheEvent::BlockStored { block_hashes, .. } => chains.push(block_hashes.len()),
            KvCacheEvent::AllBlocksCleared => unreachable!(),
        }
    }
    removed.sort();
    let mut want = announced;
    want.sort();
    assert_eq!(removed, want);
    assert_eq!(chains, [16]);
    s.check_invariants().unwrap();
}
