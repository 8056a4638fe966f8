//! Recurrent state slots in the scheduler, without a model: a sequence of a model with
//! recurrent layers holds a slot while it runs (so slots cap how many run), gives it back when
//! it finishes, is aborted or is preempted, and a fork gets its own slot with its parent's state
//! copied in (or waits to be recomputed when none is free). A prompt of such a model resumes
//! from cached blocks only as far as a snapshot of the state reaches (taken where a prompt's
//! last full block ends, the prefill cut there). A simulated state pool checks, step by step,
//! what the model's pool checks (`StatePool::begin_step`), copies (forks, snapshots, resumes)
//! included: each scheduled run starts at token 0 or exactly where its slot's state ends; and
//! every slot comes back when all sequences are gone.

mod support;

use std::collections::HashMap;

use edge_llm::engine::block_manager::BlockManager;
use edge_llm::engine::scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
use edge_llm::engine::sequence::{SeqId, SeqStatus};
use edge_llm::engine::state_slots::{StateSlot, StateSlots};
use support::splitmix::Rng;

fn scheduler(num_blocks: usize, block_size: usize, budget: usize, slots: usize) -> Scheduler {
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_batched_tokens: budget,
            max_seqs: 64,
        },
        BlockManager::new(num_blocks, block_size, 0),
    );
    s.states = StateSlots::new(slots);
    s
}

/// What the model's state pool would hold: tokens each slot's state covers.
#[derive(Default)]
struct Covers(HashMap<StateSlot, usize>);

impl Covers {
    /// Applies a schedule the way the worker and the model do: copies first, then each
    /// scheduled run, which must start at 0 or where its slot's state ends.
    fn step(&mut self, s: &Scheduler, out: &SchedulerOutput) {
        for c in &out.state_copies {
            let n = self.0.get(&c.src).copied().unwrap_or(0);
            self.0.insert(c.dst, n);
        }
        for &(id, n) in &out.scheduled {
            let seq = s.get(id).unwrap();
            let slot = seq.state_slot.expect("a scheduled sequence holds a slot");
            let start = seq.num_computed;
            let covers = self.0.get(&slot).copied().unwrap_or(0);
            assert!(
                start == 0 || covers == start,
                "sequence {id} continues at {start}, its slot {slot} covers {covers}"
            );
            self.0.insert(slot, start + n);
        }
    }
}

#[test]
fn slots_cap_running_sequences_and_all_come_back() {
    let mut s = scheduler(64, 4, 256, 2);
    s.prefix_cache = false; // no snapshot cuts: whole prompts per step
    for id in 1..=4u64 {
        s.add(SeqId(id), vec![id as u32; 6]);
    }
    let out = s.schedule();
    assert_eq!(
        out.scheduled,
        vec![(SeqId(1), 6), (SeqId(2), 6)],
        "two slots, two run"
    );
    assert_eq!(
        (s.num_running(), s.num_waiting(), s.states.num_free()),
        (2, 2, 0)
    );
    s.check_invariants().unwrap();
    s.step_done(&out);
    s.finish(SeqId(1)).unwrap(); // finished: its slot goes to the next waiting sequence
    let out = s.schedule();
    assert!(out.scheduled.contains(&(SeqId(3), 6)));
    s.check_invariants().unwrap();
    s.finish(SeqId(3)).unwrap(); // aborted while running
    s.finish(SeqId(4)).unwrap(); // aborted while waiting (it held no slot)
    s.finish(SeqId(2)).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(s.states.num_free(), 2);
    assert_eq!(s.blocks.num_free(), 64);
}

#[test]
fn prompts_resume_only_from_a_snapshot_of_the_state() {
    let mut s = scheduler(64, 4, 256, 4);
    let mut covers = Covers::default();
    let prompt: Vec<u32> = (0..40).collect();
    s.add(SeqId(1), prompt.clone());
    // The prefill stops at the prompt's last full block (36 of 40: block 9 holds the last
    // token), where the state is kept.
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 36)]);
    covers.step(&s, &out);
    s.step_done(&out);
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 4)]);
    assert_eq!(out.state_copies.len(), 1, "the snapshot");
    covers.step(&s, &out);
    s.step_done(&out);
    s.finish(SeqId(1)).unwrap();
    assert_eq!(s.states.num_snapshots(), 1);
    // The same prompt, and a longer one continuing it, resume after block 9.
    let mut longer = prompt.clone();
    longer.extend(500..520);
    // (The longer one's chunk stops at its own snapshot point, 56.)
    for (id, p, n) in [(2, prompt.clone(), 4), (3, longer, 20)] {
        s.add(SeqId(id), p.clone());
        let out = s.schedule();
        assert_eq!(out.scheduled, vec![(SeqId(id), n)], "prompt of {}", p.len());
        assert_eq!(out.state_copies.len(), 1, "resumed from the snapshot");
        assert_eq!(s.get(SeqId(id)).unwrap().num_cached, 36);
        covers.step(&s, &out);
        s.step_done(&out);
        s.check_invariants().unwrap();
        s.finish(SeqId(id)).unwrap();
    }
    // A prompt sharing cached blocks but no snapshot computes from token 0.
    s.add(SeqId(4), (0..20).chain(900..930).collect());
    let out = s.schedule();
    assert_eq!(
        out.scheduled,
        vec![(SeqId(4), 48)],
        "to its own snapshot point"
    );
    assert_eq!(s.get(SeqId(4)).unwrap().num_cached, 0);
    covers.step(&s, &out);
    // Without the prefix cache: neither a snapshot nor a cut.
    s.prefix_cache = false;
    s.add(SeqId(5), (0..40).collect());
    let out = s.schedule();
    assert!(out.scheduled.contains(&(SeqId(5), 40)));
    s.check_invariants().unwrap();
}

#[test]
fn snapshots_every_k_blocks_let_a_shared_prefix_resume() {
    let mut s = scheduler(64, 4, 256, 4);
    s.snapshot_every = 2; // blocks of 4: every 8 tokens
    let mut covers = Covers::default();
    let system: Vec<u32> = (0..20).collect();
    s.add(SeqId(1), system.iter().copied().chain(500..505).collect());
    // Cut at 8, 16 and 24 (the last full block of 25 tokens), each a snapshot.
    for n in [8, 8, 8, 1] {
        let out = s.schedule();
        assert_eq!(out.scheduled, vec![(SeqId(1), n)]);
        covers.step(&s, &out);
        s.step_done(&out);
        s.check_invariants().unwrap();
    }
    assert_eq!(s.states.num_snapshots(), 3);
    // Another question after the same 20 tokens: blocks 0..5 match, the deepest snapshot among
    // them ends at token 16.
    s.add(SeqId(2), system.iter().copied().chain(900..905).collect());
    let out = s.schedule();
    assert_eq!(s.get(SeqId(2)).unwrap().num_cached, 16);
    assert!(
        out.scheduled.contains(&(SeqId(2), 8)),
        "{:?}",
        out.scheduled
    );
    covers.step(&s, &out);
    s.check_invariants().unwrap();
}

#[test]
fn a_fork_copies_its_parents_state_or_waits_for_a_slot() {
    let mut s = scheduler(64, 4, 256, 2);
    s.prefix_cache = false; // no snapshots: the fork's copy alone
    let mut covers = Covers::default();
    s.add(SeqId(1), (0..10).collect());
    let out = s.schedule();
    covers.step(&s, &out);
    s.step_done(&out);
    s.fork(SeqId(1), SeqId(2));
    let (p, c) = (
        s.get(SeqId(1)).unwrap().state_slot,
        s.get(SeqId(2)).unwrap().state_slot,
    );
    assert!(p.is_some() && c.is_some() && p != c);
    s.append_token(SeqId(1), 100);
    s.append_token(SeqId(2), 200);
    let out = s.schedule();
    assert_eq!(out.state_copies.len(), 1);
    assert_eq!(
        (out.state_copies[0].src, out.state_copies[0].dst),
        (p.unwrap(), c.unwrap())
    );
    assert_eq!(out.scheduled, vec![(SeqId(1), 1), (SeqId(2), 1)]);
    covers.step(&s, &out);
    s.step_done(&out);
    s.check_invariants().unwrap();
    // No slot left: the next fork waits, and is recomputed from token 0 once one is free.
    s.fork(SeqId(1), SeqId(3));
    let child = s.get(SeqId(3)).unwrap();
    assert_eq!(
        (child.status, child.state_slot, child.num_computed),
        (SeqStatus::Waiting, None, 0)
    );
    s.append_token(SeqId(3), 300);
    s.check_invariants().unwrap();
    s.finish(SeqId(2)).unwrap();
    s.append_token(SeqId(1), 101);
    let out = s.schedule();
    assert!(
        out.scheduled.contains(&(SeqId(3), 12)),
        "{:?}",
        out.scheduled
    );
    covers.step(&s, &out);
    s.check_invariants().unwrap();
}

#[test]
fn preemption_gives_the_slot_back_and_recomputes_from_token_zero() {
    // 6 blocks of 4 tokens: three sequences growing to 12 tokens cannot all hold 3 blocks.
    let mut s = scheduler(6, 4, 64, 3);
    let mut covers = Covers::default();
    for id in 1..=3u64 {
        s.add(SeqId(id), vec![id as u32; 4]);
    }
    let mut steps = 0;
    while s.has_work() {
        steps += 1;
        assert!(steps < 10_000);
        let out = s.schedule();
        for id in &out.preempted {
            assert_eq!(
                s.get(*id).unwrap().state_slot,
                None,
                "preempted: slot given back"
            );
        }
        covers.step(&s, &out);
        s.check_invariants().unwrap();
        for id in s.step_done(&out) {
            if s.get(id).unwrap().generated().len() == 8 {
                s.finish(id).unwrap();
            } else {
                s.append_token(id, 7);
            }
        }
        s.check_invariants().unwrap();
    }
    assert!(
        s.num_preemptions > 0,
        "the pool was too small for all three"
    );
    assert_eq!((s.states.num_free(), s.blocks.num_free()), (3, 6));
}

#[test]
fn random_operations_keep_the_slots_exact() {
    let mut resumed = 0;
    for seed in 1..=20u64 {
        let mut rng = Rng(seed);
        let block_size = 1 + rng.below(5);
        let num_blocks = 8 + rng.below(40);
        let num_slots = 1 + rng.below(6);
        let mut s = scheduler(num_blocks, block_size, 4 + rng.below(40), num_slots);
        s.snapshot_every = rng.below(4);
        let mut covers = Covers::default();
        let prefixes: Vec<Vec<u32>> = (0..3)
            .map(|p| (0..rng.below(20) as u32).map(|t| p * 100 + t).collect())
            .collect();
        let mut next_id = SeqId(1);
        let mut live: Vec<SeqId> = Vec::new();
        for _ in 0..400 {
            match rng.below(10) {
                0..=2 => {
                    // A few shared prefixes, so snapshots are taken and resumed from.
                    let mut prompt = prefixes[rng.below(3)].clone();
                    prompt.extend((0..1 + rng.below(6)).map(|t| 5000 + t as u32));
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
                    if seq.status == SeqStatus::Running && seq.num_uncomputed() == 0 {
                        s.fork(id, next_id);
                        live.push(next_id);
                        next_id.0 += 1;
                    }
                }
                _ => {
                    let out = s.schedule();
                    covers.step(&s, &out);
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
            assert!(s.num_running() <= num_slots);
        }
        for id in live {
            s.finish(id).unwrap();
        }
        s.check_invariants().unwrap();
        assert_eq!(
            s.states.num_free(),
            num_slots,
            "seed {seed}: every slot comes back"
        );
        resumed += s.blocks.stats.hit_blocks;
        assert_eq!(
            s.blocks.num_free(),
            num_blocks,
            "seed {seed}: every block comes back"
        );
    }
    assert!(resumed > 0, "some prompts resumed from snapshots");
}
