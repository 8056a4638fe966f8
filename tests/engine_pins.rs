//! Pinned prompts never turn an admitted request into a failure (issue 30, item 2: with 15 of
//! 34 blocks pinned and "max 544 tokens per sequence" logged, a 301-token request passed
//! admission and failed with 500 "the request does not fit the KV cache"). Requests are now
//! admitted, and completions cut, against the pool less its pinned blocks.

mod support;

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, FinishReason, SubmitError};
use edge_llm::flags::cache::{pin_request, pinned_from};

const BLOCK: usize = 16;
const NUM_BLOCKS: usize = 34;

fn engine() -> EngineHandle {
    let config = EngineConfig {
        block_size: BLOCK,
        num_blocks: NUM_BLOCKS,
        max_seq_len: NUM_BLOCKS * BLOCK,
        max_batched_tokens: 512,
        max_seqs: 8,
        max_queue: 16,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    EngineHandle::start(support::shared_model(), config, EngineParts::default()).unwrap()
}

/// `n` token ids of ordinary text, different for each `salt`.
fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 300 + (i * 7 + salt * 131) % 20_000)
        .collect()
}

#[test]
fn requests_admitted_beside_pinned_prompts_finish_instead_of_failing() {
    let engine = engine();
    assert_eq!(engine.max_seq_len(), NUM_BLOCKS * BLOCK);
    // 15 full blocks pinned, as in the trial.
    let mut stream = engine
        .submit(pin_request(tokens(15 * BLOCK + 1, 1)))
        .unwrap();
    let pinned = pinned_from(stream.id, stream.next_blocking()).unwrap();
    assert_eq!(pinned.prompt_tokens, 15 * BLOCK + 1);
    let room = (NUM_BLOCKS - 15) * BLOCK;
    let m = support::wait_idle(&engine);
    assert_eq!(m.blocks_pinned, 15);
    assert_eq!(
        engine.max_seq_len(),
        room,
        "the context less the pinned blocks"
    );

    // A prompt the whole pool would hold but the unpinned part cannot: refused at submission,
    // saying how much fits, instead of failing after it was admitted.
    let long = tokens(room + 6, 2);
    match engine.submit(support::request(&long, 8, SamplingParams::greedy())) {
        Err(SubmitError::PromptTooLong { prompt, max }) => {
            assert_eq!((prompt, max), (room + 6, room));
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a prompt longer than the unpinned pool was admitted"),
    }

    // A prompt that fits, asking for more than the rest of the pool: it runs to the room and
    // ends with `length`, every token generated, no error.
    let prompt = tokens(room - 3, 3);
    let mut request = support::request(&prompt, 100, SamplingParams::greedy());
    request.ignore_eos = true;
    let mut stream = engine.submit(request).unwrap();
    let (generated, reason) = support::collect(&mut stream);
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(prompt.len() + generated.len(), room);

    // Several at once, each short enough to be admitted, together past the unpinned pool:
    // preemption takes turns, none fails.
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let mut r = support::request(&tokens(room / 2, 10 + i), 40, SamplingParams::greedy());
            r.ignore_eos = true;
            engine.submit(r).unwrap()
        })
        .collect();
    for mut s in streams {
        let (generated, reason) = support::collect(&mut s);
        assert_eq!((generated.len(), reason), (40, FinishReason::Length));
    }
    let m = support::wait_idle(&engine);
    assert_eq!(m.requests_failed, 0);
    assert_eq!(
        m.blocks_used, m.blocks_pinned,
        "every block but the pinned ones came back"
    );
}

/// Issue 30, item 2: there was no unpin, pins sharing a prefix were not tracked apart, and a pin
/// that could not fit was prefilled in full before it was refused. Now each pin holds its own
/// references (a shared prefix counts once), unpinning gives its blocks back (the context grows
/// again), and a pin past the limit is refused before any step runs.
#[test]
fn pins_share_prefixes_unpin_and_are_refused_before_prefill() {
    let engine = engine();
    let base = tokens(8 * BLOCK, 4);
    let mut longer = base.clone();
    longer.extend(tokens(4 * BLOCK, 5));
    let mut a = engine.submit(pin_request(base.clone())).unwrap();
    pinned_from(a.id, a.next_blocking()).unwrap();
    let mut b = engine.submit(pin_request(longer.clone())).unwrap();
    pinned_from(b.id, b.next_blocking()).unwrap();
    let m = support::wait_idle(&engine);
    assert_eq!(m.blocks_pinned, 12, "the shared 8 blocks count once");
    assert_eq!(engine.max_seq_len(), (NUM_BLOCKS - 12) * BLOCK);

    // Unpinning the shorter keeps the longer's blocks (its prefix included) pinned.
    assert!(engine.unpin(a.id));
    assert!(!engine.unpin(a.id), "a pin goes once");
    assert_eq!(support::wait_idle(&engine).blocks_pinned, 12);
    assert!(engine.unpin(b.id));
    let m = support::wait_idle(&engine);
    assert_eq!(m.blocks_pinned, 0);
    assert_eq!(engine.max_seq_len(), NUM_BLOCKS * BLOCK);
    assert_eq!(m.blocks_used, 0, "unpinned blocks are free (cached) again");

    // Past half the pool: refused at once, with nothing computed (the step counter is
    // published after its step's last client heard: read it once it has settled).
    std::thread::sleep(std::time::Duration::from_millis(200));
    let steps = support::wait_idle(&engine).steps;
    let mut big = engine.submit(pin_request(tokens(18 * BLOCK, 6))).unwrap();
    let e = pinned_from(big.id, big.next_blocking())
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than 17"), "{e}");
    assert_eq!(
        support::wait_idle(&engine).steps,
        steps,
        "the refused pin ran no step"
    );
}
