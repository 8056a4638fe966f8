//! vLLM's KV event wire format, as prefix-aware routers decode it: one msgpack payload per
//! message, `[timestamp_seconds, [event, ...], dp_rank]`, every event a map tagged by `"type"`:
//!
//! - `BlockStored`: `block_hashes` (u64s), `parent_block_hash` (u64 or nil), `token_ids`
//!   (`block_size` per hash), `block_size`, `lora_id` (nil), `medium`, `lora_name` (nil);
//! - `BlockRemoved`: `block_hashes`, `medium`;
//! - `AllBlocksCleared`.
//!
//! `medium` is `"GPU"`: vLLM's name for the primary KV pool (the one requests run from), which
//! routers credit as local; edge-llm's pool is that tier whichever device holds it.

use rmp::encode;

use crate::engine::kv_events::KvCacheEvent;

/// The `medium` of the primary KV pool.
pub const MEDIUM_PRIMARY: &str = "GPU";

/// The msgpack payload of one message: `events` at `timestamp` (Unix seconds), data-parallel
/// rank 0.
pub fn encode_batch(timestamp: f64, events: &[KvCacheEvent], block_size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 16 * events.len());
    // Writes into a Vec cannot fail.
    let _ = write_batch(&mut out, timestamp, events, block_size);
    out
}

fn write_batch(
    out: &mut Vec<u8>,
    timestamp: f64,
    events: &[KvCacheEvent],
    block_size: usize,
) -> Result<(), encode::ValueWriteError> {
    encode::write_array_len(out, 3)?;
    encode::write_f64(out, timestamp)?;
    encode::write_array_len(out, events.len() as u32)?;
    for e in events {
        write_event(out, e, block_size)?;
    }
    encode::write_uint(out, 0)?;
    Ok(())
}

fn write_event(
    out: &mut Vec<u8>,
    event: &KvCacheEvent,
    block_size: usize,
) -> Result<(), encode::ValueWriteError> {
    match event {
        KvCacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
        } => {
            encode::write_map_len(out, 8)?;
            write_key_str(out, "type", "BlockStored")?;
            write_hashes(out, block_hashes)?;
            encode::write_str(out, "parent_block_hash")?;
            match parent_block_hash {
                Some(h) => encode::write_uint(out, *h).map(drop)?,
                None => write_nil(out)?,
            }
            encode::write_str(out, "token_ids")?;
            encode::write_array_len(out, token_ids.len() as u32)?;
            for &t in token_ids {
                encode::write_uint(out, t as u64)?;
            }
            encode::write_str(out, "block_size")?;
            encode::write_uint(out, block_size as u64)?;
            encode::write_str(out, "lora_id")?;
            write_nil(out)?;
            write_key_str(out, "medium", MEDIUM_PRIMARY)?;
            encode::write_str(out, "lora_name")?;
            write_nil(out)?;
        }
        KvCacheEvent::BlockRemoved { block_hashes } => {
            encode::write_map_len(out, 3)?;
            write_key_str(out, "type", "BlockRemoved")?;
            write_hashes(out, block_hashes)?;
            write_key_str(out, "medium", MEDIUM_PRIMARY)?;
        }
        KvCacheEvent::AllBlocksCleared => {
            encode::write_map_len(out, 1)?;
            write_key_str(out, "type", "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn write_nil(out: &mut Vec<u8>) -> Result<(), encode::ValueWriteError> {
    encode::write_nil(out).map_err(encode::ValueWriteError::InvalidMarkerWrite)
}

fn write_key_str(out: &mut Vec<u8>, key: &str, value: &str) -> Result<(), encode::ValueWriteError> {
    encode::write_str(out, key)?;
    encode::write_str(out, value)
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64]) -> Result<(), encode::ValueWriteError> {
    encode::write_str(out, "block_hashes")?;
    encode::write_array_len(out, hashes.len() as u32)?;
    for &h in hashes {
        encode::write_uint(out, h)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
        map.as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no field {key} in {map}"))
    }

    #[test]
    fn a_batch_decodes_as_vllm_tagged_maps() {
        let events = [
            KvCacheEvent::AllBlocksCleared,
            KvCacheEvent::BlockStored {
                block_hashes: vec![u64::MAX, 7],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
            },
            KvCacheEvent::BlockStored {
                block_hashes: vec![8],
                parent_block_hash: Some(7),
                token_ids: vec![5, 6],
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![8, 7],
            },
        ];
        let bytes = encode_batch(1.5, &events, 2);
        let mut cursor = &bytes[..];
        let v = rmpv::decode::read_value(&mut cursor).unwrap();
        assert!(cursor.is_empty(), "trailing bytes");
        let batch = v.as_array().unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0].as_f64(), Some(1.5));
        assert_eq!(batch[2].as_u64(), Some(0));
        let ev = batch[1].as_array().unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(field(&ev[0], "type").as_str(), Some("AllBlocksCleared"));
        assert_eq!(ev[0].as_map().unwrap().len(), 1);
        let s = &ev[1];
        assert_eq!(field(s, "type").as_str(), Some("BlockStored"));
        let hashes: Vec<u64> = field(s, "block_hashes")
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        assert_eq!(hashes, vec![u64::MAX, 7]);
        assert!(field(s, "parent_block_hash").is_nil());
        assert_eq!(field(s, "token_ids").as_array().unwrap().len(), 4);
        assert_eq!(field(s, "block_size").as_u64(), Some(2));
        assert!(field(s, "lora_id").is_nil());
        assert!(field(s, "lora_name").is_nil());
        assert_eq!(field(s, "medium").as_str(), Some("GPU"));
        assert_eq!(field(&ev[2], "parent_block_hash").as_u64(), Some(7));
        assert_eq!(field(&ev[3], "type").as_str(), Some("BlockRemoved"));
        assert_eq!(field(&ev[3], "block_hashes").as_array().unwrap().len(), 2);
        assert_eq!(field(&ev[3], "medium").as_str(), Some("GPU"));
    }
}
