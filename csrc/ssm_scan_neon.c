/*
 * ssm_scan_neon.c: the AArch64 NEON form of Mamba-2's selective scan (el_ssm_scan in ssm_scan.c
 * calls it once NEON is chosen, for each head's channels in groups of four; the reference loop
 * runs the rest). Bit-identical to the reference, as ssm_scan_avx2.c: each lane is one channel
 * with the reference's operations in its order (multiplies and adds, never fused), the state's
 * rows read and written through 4x4 transposes, a d_state tail finished in scalar code in order.
 * Checked against the reference under qemu (tests/c/neon_check.c, tests/neon_qemu.rs).
 */
#if defined(__aarch64__)

#include <arm_neon.h>

#include "el_internal.h"
#include "simd_internal.h"

/* r[i] <- column i of the 4x4 block whose row j is r[j]. */
static inline void transpose4(float32x4_t r[4]) {
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

void el_ssm_scan_channels_neon(float *state, const float *x, const float *b, const float *c, float dt_soft_plus,
                               float dA, int64_t n_channels, int64_t d_state, float *y) {
    const float32x4_t vdA = vdupq_n_f32(dA);
    const int64_t k4 = d_state & ~(int64_t)3;
    for (int64_t i = 0; i + 4 <= n_channels; i += 4) {
        float *s = state + i * d_state; /* rows i .. i + 3 */
        const float32x4_t x_dt = vmulq_n_f32(vld1q_f32(x + i), dt_soft_plus);
        float32x4_t sum = vdupq_n_f32(0.0f);
        for (int64_t k = 0; k < k4; k += 4) {
            float32x4_t t[4];
            for (int r = 0; r < 4; r++) t[r] = vld1q_f32(s + r * d_state + k);
            transpose4(t); /* t[j]: element k + j of the four channels */
            for (int j = 0; j < 4; j++) {
                const float32x4_t v = vaddq_f32(vmulq_f32(t[j], vdA), vmulq_n_f32(x_dt, b[k + j]));
                sum = vaddq_f32(sum, vmulq_n_f32(v, c[k + j]));
                t[j] = v;
            }
            transpose4(t);
            for (int r = 0; r < 4; r++) vst1q_f32(s + r * d_state + k, t[r]);
        }
        float sums[4], xdt[4];
        vst1q_f32(sums, sum);
        vst1q_f32(xdt, x_dt);
        for (int r = 0; r < 4; r++) {
            float *sr = s + r * d_state;
            float acc = sums[r];
            for (int64_t k = k4; k < d_state; k++) {
                const float v = (sr[k] * dA) + (b[k] * xdt[r]);
                acc += v * c[k];
                sr[k] = v;
            }
            y[i + r] = acc;
        }
    }
}

#endif
