//! The checked-in FFI bindings must come from the current `csrc/edge_kernels.h` and the headers it
//! includes (`csrc/el_types.h`): a header edited without `cargo build --features regen-bindings`
//! fails here.

/// FNV-1a 64 with `\r` dropped; the same function as in build.rs.
fn header_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes.iter().filter(|&&b| b != b'\r') {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Every header the bindings are generated from, by file name (build.rs's HEADERS).
const HEADERS: &[(&str, &[u8])] = &[
    ("edge_kernels.h", include_bytes!("../csrc/edge_kernels.h")),
    ("el_types.h", include_bytes!("../csrc/el_types.h")),
];

#[test]
fn bindings_match_header() {
    let bindings = include_str!("../src/kernels/bindings.rs");
    for (name, header) in HEADERS {
        let prefix = format!("// {name} fnv1a64: ");
        let recorded = bindings
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("bindings.rs records no hash of {name}"));
        assert_eq!(
            recorded,
            format!("{:016x}", header_hash(header)),
            "csrc/{name} changed since src/kernels/bindings.rs was generated; \
             run `cargo build --features regen-bindings`"
        );
    }
}

/// A header edge_kernels.h includes from csrc/ feeds the bindings too, so it must be hashed: one
/// added without joining HEADERS (here and in build.rs) would drift unnoticed.
#[test]
fn every_local_include_is_hashed() {
    let (_, top) = HEADERS[0];
    for line in std::str::from_utf8(top).unwrap().lines() {
        let Some(rest) = line.trim_start().strip_prefix("#include") else {
            continue;
        };
        let rest = rest.trim();
        if let Some(name) = rest.strip_prefix('"') {
            let name = name.trim_end_matches('"');
            assert!(
                HEADERS.iter().any(|(n, _)| *n == name),
                "edge_kernels.h includes \"{name}\", which HEADERS (here and in build.rs) lacks"
            );
        }
    }
}
