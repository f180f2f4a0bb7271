/* bf16x8.cuh — 8 bf16 values in one 16-byte word (element 0 in the low half of .x) <-> 8 floats,
 * shared by the row kernels (act.cu, norm.cu, qkv.cu) and the persistent expert kernel. */
#ifndef NIB_BF16X8_CUH
#define NIB_BF16X8_CUH

#include <cuda_bf16.h>
#include <stdint.h>

static __device__ __forceinline__ void unpack8(uint4 u, float (&f)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}
/* round to bf16 (RNE), as the low 16 bits */
static __device__ __forceinline__ uint32_t bf16_bits(float f) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f));
}
static __device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
    uint4 u;
    u.x = bf16_bits(f[0]) | (bf16_bits(f[1]) << 16);
    u.y = bf16_bits(f[2]) | (bf16_bits(f[3]) << 16);
    u.z = bf16_bits(f[4]) | (bf16_bits(f[5]) << 16);
    u.w = bf16_bits(f[6]) | (bf16_bits(f[7]) << 16);
    return u;
}

#endif
