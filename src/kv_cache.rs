//! kv_cache
