//! The flat batch a forward step runs: every scheduled token of every sequence, with the
//! integers the kernels need to find its KV slots. Kernels never see a sequence, only this.

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
}

impl Batch {
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Number of keys token `t` attends to: everything up to and including itself.
    pub fn context_lens(&self) -> Vec<i32> {
        self.positions.iter().map(|&p| p + 1).collect()
    }

    /// Adds a sequence's block table; returns its row index for `push_token`.
    /// `max_blocks_per_seq` must be set first and cover `table`.
    pub fn push_block_table(&mut self, table: &[u32]) -> i32 {
        assert!(
            table.len() <= self.max_blocks_per_seq,
            "block table longer than max_blocks_per_seq"
        );
        let row = (self.block_tables.len() / self.max_blocks_per_seq.max(1)) as i32;
        self.block_tables.extend(table.iter().map(|&b| b as i32));
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
