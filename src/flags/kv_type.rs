//! `--cache-type-k` and `--cache-type-v` (`-ctk`, `-ctv` as llama.cpp spells them): what the KV
//! pool holds keys and values in, for every command that builds a pool (through `EngineArgs`)
//! and for `perplexity`.

use std::ffi::OsString;

use clap::Args;

use crate::kernels::tensor_type::TensorType;
use crate::kernels::{parse_kv_type, KvTypes};

/// The KV cache's element types.
#[derive(Args, Debug, Clone)]
pub struct KvTypeArgs {
    /// KV cache type of the keys (-ctk): f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl, as
    /// llama.cpp's; the 32-element types (all but f16 and bf16) need a head size that is a
    /// multiple of 32, and shrink the bytes per block (more tokens in the same --kv-mem)
    #[arg(long = "cache-type-k", value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type_k: TensorType,
    /// KV cache type of the values (-ctv): the types of --cache-type-k
    #[arg(long = "cache-type-v", value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type_v: TensorType,
}

impl KvTypeArgs {
    pub fn kv_types(&self) -> KvTypes {
        KvTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }
}

/// llama.cpp's one-dash long flags `-ctk` and `-ctv` (also `-ctk=TYPE`) as `--cache-type-k` and
/// `--cache-type-v`; every other argument unchanged. The binary maps its arguments through this
/// before parsing (clap's short flags are one letter: `-ctk` would read as `-c tk`).
pub fn expand_llama_flags(arg: OsString) -> OsString {
    let Some(s) = arg.to_str() else { return arg };
    for (short, long) in [("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")] {
        if s == short {
            return long.into();
        }
        if let Some(value) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
            return format!("{long}={value}").into();
        }
    }
    arg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_flags_expand_and_nothing_else_changes() {
        let x = |s: &str| expand_llama_flags(s.into()).into_string().unwrap();
        assert_eq!(x("-ctk"), "--cache-type-k");
        assert_eq!(x("-ctv=q4_0"), "--cache-type-v=q4_0");
        assert_eq!(x("-c"), "-c");
        assert_eq!(x("-ctkx"), "-ctkx");
        assert_eq!(x("q8_0"), "q8_0");
    }
}
