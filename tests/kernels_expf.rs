//! `kernels::expf` -- the exp that SwiGLU's SIMD variant computes eight lanes at a time
//! (csrc/expf_avx2.h) -- against the process's libm `expf`, bit for bit, on every ISA this machine
//! has: every float in [-110, 100] at a stride, every float with |x| in [88, 110] (where glibc's
//! special cases live), and the special values (+-0, subnormals, +-inf, NaNs with payloads, the
//! overflow and underflow borders and their neighbours). The SwiGLU reference calls libm's expf,
//! so this is what makes the SIMD SwiGLU bit-identical to it on a wide range of gates; SwiGLU
//! itself is checked on the same sweep here and on random data in tests/kernels_simd.rs.
//!
//! The kernel reproduces glibc's `__expf_fma` (glibc 2.27 and later, e_expf.c, what the ifunc
//! picks on a CPU with FMA and AVX2); every message names the glibc version compared against. An
//! exhaustive run over all 2^32 inputs was done offline (README, issue 14 section). x86_64 Linux
//! with glibc only: elsewhere no SIMD variant uses this exp.

#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

mod support;

use std::ffi::CStr;
use std::os::raw::c_char;

use edge_llm::kernels::{available_isas, expf, glu_inplace, set_isa, Activation, Isa};

extern "C" {
    /// The C library's own expf (not Rust's f32::exp, which constant folding could bypass).
    #[link_name = "expf"]
    fn libm_expf(x: f32) -> f32;
    fn gnu_get_libc_version() -> *const c_char;
}

/// "glibc 2.36", for messages.
fn libm_name() -> String {
    // SAFETY: glibc returns a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(gnu_get_libc_version()) };
    format!("glibc {}", v.to_string_lossy())
}

use support::isa_lock::lock_isa;

/// The ISAs whose el_expf must equal libm's: AVX2, and the scalar form too where the CPU has FMA
/// (without it glibc runs its other build, __expf_sse2, which rounds x * 32/ln2 before
/// subtracting and may differ in the last bit; the scalar SwiGLU calls libm's expf either way).
fn isas_to_check() -> Vec<Isa> {
    let fma = std::arch::is_x86_feature_detected!("fma");
    available_isas()
        .into_iter()
        .filter(|&isa| isa != Isa::Scalar || fma)
        .collect()
}

/// The inputs whose result glibc rounds from closest to a float midpoint
/// (tests/reference/README.md): a strided sweep hits few of them.
fn hard_cases() -> Vec<f32> {
    include_str!("reference/expf_hard_cases.txt")
        .lines()
        .map(|l| f32::from_bits(u32::from_str_radix(l.trim(), 16).expect("hex bits")))
        .collect()
}

/// Every float in [-110, 100] whose bits are a multiple of `stride` from the range's ends, every
/// float with |x| in [88, 110], the hard cases and the special values.
fn inputs(stride: u32) -> Vec<f32> {
    let mut x = hard_cases();
    let (pos_end, neg_end) = (100f32.to_bits(), (-110f32).to_bits());
    x.extend((0..=pos_end).step_by(stride as usize).map(f32::from_bits));
    x.extend(
        (0x8000_0000..=neg_end)
            .step_by(stride as usize)
            .map(f32::from_bits),
    );
    for sign in [0u32, 0x8000_0000] {
        x.extend((88f32.to_bits()..=110f32.to_bits()).map(|b| f32::from_bits(b | sign)));
    }
    let borders = [
        f32::from_bits(0x42b1_7217), // 0x1.62e42ep6: above, overflow to +inf
        f32::from_bits(0xc2cf_f1b4), // -0x1.9fe368p6: below, 0
        f32::from_bits(0xc2ce_8ecf), // -0x1.9d1d9ep6: below, the smallest subnormal
        88.0,
        -88.0,
        88.72284,
        -87.33655, // expf becomes subnormal
        -103.27893,
        -103.97208,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1.0,
        -1.0,
        0.5,
        f32::EPSILON,
    ];
    for b in borders {
        for d in -8i32..=8 {
            x.push(f32::from_bits(b.to_bits().wrapping_add_signed(d)));
        }
    }
    for sign in [0u32, 0x8000_0000] {
        for bits in [
            0u32, // +-0
            1,    // the smallest subnormal
            2,
            0x0000_ffff,
            0x007f_fffe,
            0x007f_ffff, // the largest subnormal
            0x7f80_0000, // inf
            0x7fc0_0000, // the default NaN
            0x7fc0_1234, // a quiet NaN with a payload
            0x7f80_0001, // signalling NaNs
            0x7fa0_0000,
            0x7fff_ffff,
        ] {
            x.push(f32::from_bits(bits | sign));
        }
    }
    x
}

fn check_expf(isa: Isa, x: &[f32]) {
    // Lengths that are not multiples of 8 exercise the tails.
    for chunk in x.chunks(4093) {
        let mut got = vec![0.0f32; chunk.len()];
        expf(chunk, &mut got);
        for (&xi, &g) in chunk.iter().zip(&got) {
            // SAFETY: expf is a pure libm function.
            let want = unsafe { libm_expf(xi) };
            assert!(
                g.to_bits() == want.to_bits(),
                "{isa} expf({xi:e}) (bits {:#010x}) = {g:e} (bits {:#010x}), {}'s expf = {want:e} (bits {:#010x})",
                xi.to_bits(),
                g.to_bits(),
                libm_name(),
                want.to_bits()
            );
        }
    }
}

#[test]
fn expf_is_libm_expf_bit_for_bit_on_every_isa() {
    let _guard = lock_isa();
    let x = inputs(61);
    let isas = isas_to_check();
    eprintln!(
        "comparing el_expf on {isas:?} with {}'s expf on {} inputs",
        libm_name(),
        x.len()
    );
    for isa in isas {
        set_isa(isa).expect("available ISA");
        check_expf(isa, &x);
    }
}

#[test]
fn swiglu_is_the_reference_on_a_sweep_of_gates() {
    let _guard = lock_isa();
    // gate = -x: expf(-gate) sweeps the same inputs; up = 1 and a varying up.
    let gate: Vec<f32> = inputs(997).iter().map(|v| -v).collect();
    let ups: Vec<Vec<f32>> = vec![
        vec![1.0; gate.len()],
        (0..gate.len())
            .map(|i| ((i % 17) as f32 - 8.0) * 0.37)
            .collect(),
    ];
    for up in &ups {
        set_isa(Isa::Scalar).unwrap();
        let mut want = gate.clone();
        glu_inplace(&mut want, up, Activation::SwiGlu);
        for isa in available_isas().into_iter().filter(|&i| i != Isa::Scalar) {
            set_isa(isa).unwrap();
            let mut got = gate.clone();
            glu_inplace(&mut got, up, Activation::SwiGlu);
            for i in 0..gate.len() {
                let (g, w) = (got[i], want[i]);
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{isa} swiglu(gate {:e}, up {:e}) = {g:e}, the reference's (libm expf, {}) {w:e}",
                    gate[i],
                    up[i],
                    libm_name()
                );
            }
        }
    }
}
