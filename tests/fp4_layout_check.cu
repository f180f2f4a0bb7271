/* fp4_layout_check.cu — host-side check of the FP4 word layout of the low-bit GEMM: the repack's
 * bit positions (fp4_pos) and the kernel's decoder (dec_e2m1, ops/cuda/gemm_lowbit.cuh) agree
 * for every element and code. Compiled by nvcc (the header is CUDA C++) but runs on the CPU,
 * so CUDA builds check it without a GPU; tests/test_gemm_gpu.c calls it. */
#include <stdio.h>

#include "ops/cuda/gemm_lowbit.cuh"

extern "C" int nib_test_fp4_layout(char *msg, size_t cap) {
    using namespace nib;
    /* the eight elements' bit positions cover the 32-bit word exactly once */
    uint32_t cover = 0;
    for (int i = 0; i < 8; i++) {
        const Fp4Pos ps = fp4_pos(i);
        const int bits[4] = {ps.mag[0], ps.mag[1], ps.mag[2], ps.sign};
        for (int b = 0; b < 4; b++) {
            if (bits[b] < 0 || bits[b] > 31 || (cover >> bits[b] & 1u)) {
                snprintf(msg, cap, "element %d: bit %d out of range or used twice", i, bits[b]);
                return 0;
            }
            cover |= 1u << bits[b];
        }
    }
    /* every code at every position, the other seven elements from a fixed pseudo-random stream */
    uint32_t rng = 0x9E3779B9u;
    for (int e = 0; e < 8; e++)
        for (uint32_t c = 0; c < 16; c++)
            for (int rep = 0; rep < 64; rep++) {
                uint32_t codes[8], q = 0;
                for (int i = 0; i < 8; i++) {
                    rng = rng * 1664525u + 1013904223u;
                    codes[i] = i == e ? c : rng >> 28;
                    const Fp4Pos ps = fp4_pos(i);
                    for (int b = 0; b < 3; b++) q |= ((codes[i] >> b) & 1u) << ps.mag[b];
                    q |= ((codes[i] >> 3) & 1u) << ps.sign;
                }
                uint32_t a[4];
                dec_e2m1(q, a);
                for (int i = 0; i < 8; i++) {
                    const uint32_t half = (a[i / 2] >> (16 * (i % 2))) & 0xFFFFu;
                    const uint32_t want = ((codes[i] >> 3) << 15) | ((codes[i] & 7u) << 6);
                    if (half != want) {
                        snprintf(msg, cap, "word %08x: element %d (code %u) decodes to %04x, expected %04x", q, i,
                                 codes[i], half, want);
                        return 0;
                    }
                }
            }
    return 1;
}
