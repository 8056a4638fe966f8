//! The flat batch a forward step runs: every scheduled token of every sequence, with the
//! integers the kernels need to find its KV slots. Kernels never see a sequence, only this.
//! [`Batch::validate`] checks it once per step, before any backend touches memory with it.

use std::ops::Range;

use anyhow::{bail, Result};

use super::kv_cache::BlockId;

/// One forward step's input. All per-token vectors have `n_tokens` entries.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Token ids, [n_tokens].
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence, [n_tokens].
    pub positions: Vec<i32>,
    /// KV slot each token's key and value are written to, [n_tokens]
    /// (slot = block_id * block_size + offset in block).
    pub slot_mapping: Vec<i64>,
    /// Row of `block_tables` each token's sequence uses, [n_tokens].
    pub token_seq: Vec<i32>,
    /// Block table of each sequence in the batch, padded with -1: [n_seqs][max_blocks_per_seq].
    pub block_tables: Vec<i32>,
    pub max_blocks_per_seq: usize,
    /// Indices of the tokens whose logits are wanted, in output order.
    pub logits_rows: Vec<usize>,
    /// State slot of each sequence row (`super::state_pool`), [n_seqs], for a model with
    /// recurrent layers; empty for one without.
    pub state_slots: Vec<i32>,
    /// Indices of the tokens whose embedding is wanted (the final hidden state after the
    /// output norm, `n_embd` floats), in output order; independent of `logits_rows`.
    pub embd_rows: Vec<usize>,
}

impl Batch {
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Number of keys token `t` attends to: everything up to and including itself.
    pub fn context_lens(&self) -> Vec<i32> {
        self.positions.iter().map(|&p| p + 1).collect()
    }

    /// Checks every index the kernels will follow: token ids inside the vocabulary, KV slots and
    /// block ids inside a pool of `num_blocks` blocks of `block_size` tokens, each token's
    /// context inside its block table, logits rows inside the batch. A bad one would make a
    /// kernel read or write outside its buffers, so the forward pass calls this first.
    pub fn validate(&self, vocab_size: usize, block_size: usize, num_blocks: usize) -> Result<()> {
        let n = self.n_tokens();
        if self.positions.len() != n || self.slot_mapping.len() != n || self.token_seq.len() != n {
            bail!("batch vectors of different lengths");
        }
        if let Some(&bad) = self.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            bail!("token id {bad} is outside the vocabulary of {vocab_size} tokens");
        }
        let num_slots = (num_blocks * block_size) as i64;
        if let Some(&s) = self.slot_mapping.iter().find(|&&s| s >= num_slots) {
            bail!("KV slot {s} is outside the pool of {num_slots}");
        }
        let mb = self.max_blocks_per_seq;
        let n_seqs = self.block_tables.len() / mb.max(1);
        if self.block_tables.len() != n_seqs * mb {
            bail!(
                "block tables of {} entries for {mb} per sequence",
                self.block_tables.len()
            );
        }
        for t in 0..n {
            let (seq, len) = (self.token_seq[t], self.positions[t] as i64 + 1);
            if seq < 0 || seq as usize >= n_seqs || len < 1 || len as usize > mb * block_size {
                bail!("token {t}: sequence row {seq} or context length {len} out of range");
            }
            let table = &self.block_tables[seq as usize * mb..][..mb];
            if !table[..(len as usize).div_ceil(block_size)]
                .iter()
                .all(|&b| b >= 0 && (b as usize) < num_blocks)
            {
                bail!("token {t}: block id out of range");
            }
        }
        if let Some(&r) = self.logits_rows.iter().find(|&&r| r >= n) {
            bail!("logits row {r} of a batch of {n} tokens");
        }
        if !self.state_slots.is_empty() && self.state_slots.len() != n_seqs {
            bail!(
                "{} state slots for {n_seqs} sequence rows",
                self.state_slots.len()
            );
        }
        if let Some(&r) = self.embd_rows.iter().find(|&&r| r >= n) {
            bail!("embedding row {r} of a batch of {n} tokens");
        }
        Ok(())
    }

    /// Number of sequences (rows of `block_tables`).
    pub fn n_seqs(&self) -> usize {
        self.block_tables.len() / self.max_blocks_per_seq.max(1)
    }

    /// An empty batch whose block tables hold up to `max_blocks_per_seq` blocks.
    pub fn with_max_blocks(max_blocks_per_seq: usize) -> Batch {
        Batch {
            max_blocks_per_seq,
            ..Default::default()
        }
    }

    /// Adds one sequence: its block table (blocks of `block_size` tokens) and its tokens at
    /// `positions` (`token_at(position)` gives each), each written to its KV slot in the table;
    /// the tokens at positions from `logits_from` on want logits (`positions.end` for none).
    /// Every batch (the engine's steps, the draft model's, scoring's) is built through this.
    pub fn push_sequence(
        &mut self,
        block_table: &[BlockId],
        block_size: usize,
        positions: Range<usize>,
        token_at: impl Fn(usize) -> u32,
        logits_from: usize,
    ) {
        let row = self.push_block_table(block_table);
        self.push_tokens(block_table, block_size, row, positions, token_at, |pos| {
            pos >= logits_from
        });
    }

    /// Adds the tokens at `positions` of the sequence whose block table (`block_table`) is row
    /// `seq`, each written to its KV slot; those for which `want_logits(position)` holds want
    /// logits.
    pub fn push_tokens(
        &mut self,
        block_table: &[BlockId],
        block_size: usize,
        seq: i32,
        positions: Range<usize>,
        token_at: impl Fn(usize) -> u32,
        want_logits: impl Fn(usize) -> bool,
    ) {
        for pos in positions {
            let slot = block_table[pos / block_size].index() * block_size + pos % block_size;
            self.push_token(token_at(pos), pos, slot, seq, want_logits(pos));
        }
    }

    /// Adds a token whose key and value are already in the cache at `position` of sequence
    /// row `seq`: it is computed again for its logits only, and writes no KV slot (slot -1,
    /// which every KV write skips), so a shared cached block is never written.
    pub fn push_reread(&mut self, token: u32, position: usize, seq: i32) {
        self.logits_rows.push(self.tokens.len());
        self.tokens.push(token);
        self.positions.push(position as i32);
        self.slot_mapping.push(-1);
        self.token_seq.push(seq);
    }

    /// Adds a sequence's block table; returns its row index for `push_token` (tests build odd
    /// batches with these two; the engine, scoring and the draft model use `push_sequence`).
    /// `max_blocks_per_seq` must be set first and cover `table`.
    pub fn push_block_table(&mut self, table: &[BlockId]) -> i32 {
        assert!(
            table.len() <= self.max_blocks_per_seq,
            "block table longer than max_blocks_per_seq"
        );
        let row = (self.block_tables.len() / self.max_blocks_per_seq.max(1)) as i32;
        self.block_tables.extend(table.iter().map(|&b| b.0 as i32));
        self.block_tables.extend(std::iter::repeat_n(
            -1,
            self.max_blocks_per_seq - table.len(),
        ));
        row
    }

    /// Adds one token of the sequence whose block table is row `seq`.
    pub fn push_token(
        &mut self,
        token: u32,
        position: usize,
        slot: usize,
        seq: i32,
        want_logits: bool,
    ) {
        if want_logits {
            self.logits_rows.push(self.tokens.len());
        }
        self.tokens.push(token);
        self.positions.push(position as i32);
        self.slot_mapping.push(slot as i64);
        self.token_seq.push(seq);
    }
}
