//! The checked-in FFI bindings must come from the current `csrc/edge_kernels.h`: a header edited
//! without `cargo build --features regen-bindings` fails here.

/// FNV-1a 64 with `\r` dropped; the same function as in build.rs.
fn header_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes.iter().filter(|&&b| b != b'\r') {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[test]
fn bindings_match_header() {
    let header = include_bytes!("../csrc/edge_kernels.h");
    let bindings = include_str!("../src/kernels/bindings.rs");
    let recorded = bindings
        .lines()
        .find_map(|l| l.strip_prefix("// edge_kernels.h fnv1a64: "))
        .expect("bindings.rs records the header hash it was generated from");
    assert_eq!(
        recorded,
        format!("{:016x}", header_hash(header)),
        "csrc/edge_kernels.h changed since src/kernels/bindings.rs was generated; \
         run `cargo build --features regen-bindings`"
    );
}
