//! The block manager and the scheduler alone, without a model: prefix caching, LRU eviction,
//! copy-on-write, preemption, and long random sequences of operations with the invariants
//! checked after every one (reference counts add up to the block tables, no block is both free
//! and in use, every block comes back when all sequences are gone).

mod support;

use edge_llm::engine::block_manager::{BlockCopy, BlockManager};
use edge_llm::engine::scheduler::{Scheduler, SchedulerConfig};
use edge_llm::engine::sequence::SeqId;
use support::splitmix::Rng;

#[test]
fn prefix_blocks_are_shared_and_survive_free_until_evicted() {
    let mut m = BlockManager::new(8, 4, 0);
    let prompt: Vec<u32> = (0..10).collect();
    assert!(m.match_prefix(&prompt).is_empty());
    let mut a = Vec::new();
    m.allocate(&mut a, 0, 10).unwrap();
    assert_eq!(a.len(), 3);
    m.register_full_blocks(&a, &prompt, 10);
    // The same prompt finds the two full blocks (never the one holding the last token).
    let b = m.match_prefix(&prompt);
    assert_eq!(b, a[..2].to_vec());
    assert_eq!(m.ref_count(a[0]), 2);
    m.check_invariants([a.as_slice(), b.as_slice()]).unwrap();
    let mut b = b;
    m.free(&mut a);
    m.free(&mut b);
    assert_eq!(m.num_free(), 8);
    assert_eq!(m.num_cached_free(), 2);
    // Freed blocks keep their hash: a later identical prompt still hits.
    let c = m.match_prefix(&prompt);
    assert_eq!(c.len(), 2);
    m.check_invariants([c.as_slice()]).unwrap();
    // A different prefix misses; different salt misses too.
    let other: Vec<u32> = (100..110).collect();
    assert!(m.match_prefix(&other).is_empty());
    let mut salted = BlockManager::new(8, 4, 1);
    assert!(salted.match_prefix(&prompt).is_empty());
}

#[test]
fn eviction_takes_the_least_recently_freed_block_first() {
    let mut m = BlockManager::new(4, 2, 0);
    let p1 = vec![1, 2, 3];
    let p2 = vec![4, 5, 6];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    m.allocate(&mut a, 0, 3).unwrap();
    m.register_full_blocks(&a, &p1, 2);
    m.allocate(&mut b, 0, 3).unwrap();
    m.register_full_blocks(&b, &p2, 2);
    m.free(&mut a); // p1's blocks freed first: least recently used
    m.free(&mut b);
    // Taking two blocks evicts p1's cached block (after p1's uncached tail) and keeps p2's.
    let mut c = Vec::new();
    m.allocate(&mut c, 0, 4).unwrap();
    assert!(m.match_prefix(&p1).is_empty(), "p1 evicted");
    let hit = m.match_prefix(&p2);
    assert_eq!(hit.len(), 1, "p2 still cached");
    m.check_invariants([c.as_slice(), hit.as_slice()]).unwrap();
}

#[test]
fn fork_shares_blocks_and_copies_the_partial_one_on_write() {
    let mut m = BlockManager::new(8, 4, 0);
    let mut parent = Vec::new();
    m.allocate(&mut parent, 0, 6).unwrap(); // blocks: full + partial (2 of 4)
    let mut child = m.fork(&parent);
    assert_eq!(child, parent);
    assert_eq!(m.ref_count(parent[1]), 2);
    // The parent writes token 6 into the shared partial block: it gets a private copy.
    let copy = m.allocate(&mut parent, 6, 7).unwrap();
    assert_eq!(
        copy,
        Some(BlockCopy {
            src: child[1],
            dst: parent[1]
        })
    );
    assert_ne!(parent[1], child[1]);
    assert_eq!(m.ref_count(child[1]), 1);
    // The child now owns its block alone: no copy.
    assert_eq!(m.allocate(&mut child, 6, 7).unwrap(), None);
    // The full first block stays shared.
    assert_eq!(parent[0], child[0]);
    assert_eq!(m.ref_count(parent[0]), 2);
    m.check_invariants([parent.as_slice(), child.as_slice()])
        .unwrap();
    m.free(&mut parent);
    m.free(&mut child);
    assert_eq!(m.num_free(), 8);
    m.check_invariants([]).unwrap();
}

#[test]
fn allocation_fails_cleanly_when_blocks_run_out() {
    let mut m = BlockManager::new(2, 4, 0);
    let mut a = Vec::new();
    assert!(m.allocate(&mut a, 0, 9).is_none());
    assert!(a.is_empty(), "nothing taken on failure");
    assert_eq!(m.num_free(), 2);
}

fn scheduler(num_blocks: usize, block_size: usize, budget: usize) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_batched_tokens: budget,
            max_seqs: 64,
        },
        BlockManager::new(num_blocks, block_size, 0),
    )
}

/// Runs `sched` to completion like the engine would, appending `token(seq, i)` after each
/// step that finishes a sequence's tokens, until each has `gen` tokens.
fn drain(sched: &mut Scheduler, gen: usize) -> Vec<(SeqId, Vec<u32>)> {
    let mut done = Vec::new();
    let mut steps = 0;
    while sched.has_work() {
        steps += 1;
        assert!(steps < 100_000, "no progress");
        let out = sched.schedule();
        assert!(out.num_tokens() <= sched.config.max_batched_tokens);
        sched.check_invariants().unwrap();
        for id in sched.step_done(&out) {
            let seq = sched.get(id).unwrap();
            let n = seq.generated().len();
            if n == gen {
                let seq = sched.finish(id).unwrap();
                done.push((id, seq.tokens));
            } else {
                let token = (id.0 * 1000 + n as u64) as u32;
                sched.append_token(id, token);
            }
        }
        sched.check_invariants().unwrap();
    }
    done.sort();
    done
}

#[test]
fn a_shared_prompt_is_computed_once() {
    let mut s = scheduler(64, 4, 64);
    let system: Vec<u32> = (0..40).collect();
    s.add(SeqId(1), system.iter().copied().chain([900, 901]).collect());
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 42)]);
    s.step_done(&out);
    // Later arrivals with the same 40-token prefix reuse its 10 blocks.
    for id in 2..=4u64 {
        s.add(
            SeqId(id),
            system.iter().copied().chain([900 + id as u32]).collect(),
        );
    }
    let out = s.schedule();
    let prefill: Vec<_> = out.scheduled.iter().filter(|x| x.0 != SeqId(1)).collect();
    assert_eq!(
        prefill,
        vec![&(SeqId(2), 1), &(SeqId(3), 1), &(SeqId(4), 1)],
        "only the new token of each prompt is computed"
    );
    assert_eq!(s.blocks.stats.hit_blocks, 30);
    s.check_invariants().unwrap();
}

#[test]
fn simultaneous_arrivals_wait_for_a_prefix_in_flight() {
    let mut s = scheduler(64, 4, 256);
    let system: Vec<u32> = (0..40).collect();
    for id in 1..=4u64 {
        s.add(
            SeqId(id),
            system.iter().copied().chain([900 + id as u32]).collect(),
        );
    }
    // Only the first computes the shared prefix; the others wait one step for it.
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 41)]);
    s.check_invariants().unwrap();
    s.step_done(&out);
    s.append_token(SeqId(1), 7);
    let out = s.schedule();
    assert_eq!(
        out.scheduled,
        vec![(SeqId(1), 1), (SeqId(2), 1), (SeqId(3), 1), (SeqId(4), 1)]
    );
    assert_eq!(s.blocks.stats.hit_blocks, 30);
    s.check_invariants().unwrap();
    // A sequence that differs from the first block on computes at once.
    s.add(SeqId(9), (500..540).collect());
    let out = s.schedule();
    assert!(out.scheduled.contains(&(SeqId(9), 40)));
}

#[test]
fn chunked_prefill_shares_the_budget_with_decodes() {
    let mut s = scheduler(64, 4, 8);
    s.add(SeqId(1), vec![1, 2, 3]);
    let out = s.schedule();
    s.step_done(&out);
    s.append_token(SeqId(1), 7);
    s.add(SeqId(2), (0..30).collect());
    // The decode goes first; the long prompt takes the rest of the budget, chunk by chunk.
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 1), (SeqId(2), 7)]);
    s.step_done(&out);
    s.append_token(SeqId(1), 8);
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 1), (SeqId(2), 7)]);
}

#[test]
fn preemption_takes_the_latest_arrival_and_everything_completes() {
    // 6 blocks of 4 tokens: three sequences growing to 12 tokens cannot all hold 3 blocks.
    let mut s = scheduler(6, 4, 64);
    for id in 1..=3u64 {
        s.add(SeqId(id), vec![id as u32; 4]);
    }
    let done = drain(&mut s, 8);
    assert!(
        s.num_preemptions > 0,
        "the pool was too small for all three"
    );
    assert_eq!(done.len(), 3);
    for (id, tokens) in &done {
        assert_eq!(tokens.len(), 12);
        let expected: Vec<u32> = (0..8).map(|n| (id.0 * 1000 + n) as u32).collect();
        assert_eq!(
            &tokens[4..],
            &expected[..],
            "sequence {id} kept its tokens through preemption"
        );
    }
    assert_eq!(s.blocks.num_free(), 6);
    s.check_invariants().unwrap();
}

#[test]
fn random_operations_keep_the_invariants() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed);
        let block_size = 1 + rng.below(5);
        let num_blocks = 8 + rng.below(40);
        let mut s = scheduler(num_blocks, block_size, 4 + rng.below(40));
        let prefixes: Vec<Vec<u32>> = (0..3)
            .map(|p| (0..rng.below(20) as u32).map(|t| p * 100 + t).collect())
            .collect();
        let mut next_id = SeqId(1);
        let mut live: Vec<SeqId> = Vec::new();
        for _ in 0..400 {
            match rng.below(10) {
                0..=2 => {
                    let mut prompt = prefixes[rng.below(3)].clone();
                    prompt.extend((0..1 + rng.below(10)).map(|t| 5000 + t as u32));
                    if s.fits(prompt.len() + 16) {
                        s.add(next_id, prompt);
                        live.push(next_id);
                        next_id.0 += 1;
                    }
                }
                3 if !live.is_empty() => {
                    let id = live.remove(rng.below(live.len()));
                    s.finish(id).unwrap(); // abort
                }
                4 if !live.is_empty() => {
                    let id = live[rng.below(live.len())];
                    let seq = s.get(id).unwrap();
                    if seq.status == edge_llm::engine::sequence::SeqStatus::Running
                        && seq.num_uncomputed() == 0
                    {
                        s.fork(id, next_id);
                        live.push(next_id);
                        next_id.0 += 1;
                    }
                }
                _ => {
                    let out = s.schedule();
                    s.check_invariants().unwrap();
                    for id in s.step_done(&out) {
                        let seq = s.get(id).unwrap();
                        if seq.len() >= num_blocks.min(48) * block_size / 4 || rng.below(8) == 0 {
                            s.finish(id).unwrap();
                            live.retain(|&l| l != id);
                        } else {
                            s.append_token(id, rng.below(50_000) as u32);
                        }
                    }
                }
            }
            s.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        for id in live {
            s.finish(id).unwrap();
        }
        s.check_invariants().unwrap();
        assert_eq!(
            s.blocks.num_free(),
            num_blocks,
            "seed {seed}: every block comes back"
        );
    }
}

/// Issue 31's KV waste: the used blocks' slots against the tokens they hold, a shared prefix
/// counted once. Four sequences on a 40-token prefix (10 blocks of 4) with 2 tokens each after
/// it: 10 shared blocks full and one block per sequence holding 2 of its 4 slots.
#[test]
fn kv_fill_counts_shared_blocks_once_and_partial_blocks_as_waste() {
    let mut s = scheduler(64, 4, 256);
    let system: Vec<u32> = (0..40).collect();
    for id in 1..=4u64 {
        let prompt = system.iter().copied().chain([900 + id as u32, 7]);
        s.add(SeqId(id), prompt.collect());
    }
    assert_eq!(s.kv_fill(), (0, 0), "nothing computed, nothing held");
    // The first computes the prefix, the others reuse it the step after.
    for _ in 0..2 {
        let out = s.schedule();
        s.step_done(&out);
    }
    let (stored, slots) = s.kv_fill();
    assert_eq!(slots, (10 + 4) * 4);
    assert_eq!(stored, 40 + 4 * 2);
    s.check_invariants().unwrap();
}
