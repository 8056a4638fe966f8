//! KV events of a model with recurrent layers: its blocks are announced (`BlockStored`) only as
//! far as a recurrent state snapshot reaches, since a prompt matching more of the chain still
//! resumes from the deepest snapshot and recomputes the rest; a router that sees the block
//! therefore sees what the instance can really skip (docs/routers.md, "Hybrid models"). Called
//! by the scheduler when a snapshot is taken and by the disk tier's parking when one is read
//! back.

use super::{BlockHash, BlockId, BlockManager, KvCacheEvent};

impl BlockManager {
    /// Announces blocks only through `announce_through` (where a state snapshot ends).
    pub fn announce_at_snapshots(&mut self) {
        self.at_snapshots = true;
    }

    /// Announces the chain of `table`'s registered blocks up to the one of hash `last` (a
    /// state snapshot ends there): one `BlockStored` per run not announced yet. Nothing unless
    /// events are on and in announce-at-snapshots mode.
    pub fn announce_through(&mut self, table: &[BlockId], last: BlockHash) {
        let hashes: Vec<BlockHash> = table
            .iter()
            .map_while(|&id| self.blocks[id.index()].hash)
            .collect();
        if let Some(n) = hashes.iter().position(|&h| h == last) {
            self.announce_chain(&hashes[..=n]);
        }
    }

    /// As `announce_through`, for the chain of `hashes` (each cached, the first a root or
    /// after an announced block).
    pub fn announce_chain(&mut self, hashes: &[BlockHash]) {
        let (Some(events), true) = (&mut self.events, self.at_snapshots) else {
            return;
        };
        let mut parent = None;
        let mut stored: Option<KvCacheEvent> = None;
        for &h in hashes {
            let Some(&id) = self.cached.get(&h) else {
                break;
            };
            let b = &mut self.blocks[id.index()];
            if !std::mem::replace(&mut b.announced, true) {
                match &mut stored {
                    Some(KvCacheEvent::BlockStored {
                        block_hashes,
                        token_ids,
                        ..
                    }) => {
                        block_hashes.push(h);
                        token_ids.extend_from_slice(&b.token_ids);
                    }
                    _ => {
                        stored = Some(KvCacheEvent::BlockStored {
                            block_hashes: vec![h],
                            parent_block_hash: parent,
                            token_ids: b.token_ids.clone(),
                        })
                    }
                }
            } else {
                events.extend(stored.take());
            }
            parent = Some(h);
        }
        events.extend(stored);
    }
}
