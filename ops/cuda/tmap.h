/* tmap.h — TMA tensor maps for nib's wgmma kernels (2-D: gemm_fp8.cu, gemm_lowbit.cu; N-D bf16: the
 * wgmma attention, attention.cu).
 *
 * The driver's cuTensorMapEncodeTiled is reached through the runtime
 * (cudaGetDriverEntryPointByVersion): nib links no libcuda. One encoder for every kernel, so the
 * layout rules live in one place: a row-major matrix of `rows` rows x `cols` elements (row pitch
 * `ld` elements, a multiple of 16 bytes; base 16-byte aligned), read in boxes of box_rows rows x
 * box_cols elements (box_cols * elem bytes = 128: one 128-byte swizzle row), 128-byte swizzle,
 * zeros for every element outside the matrix. */
#ifndef NIB_OPS_CUDA_TMAP_H
#define NIB_OPS_CUDA_TMAP_H

#include <cuda.h>
#include <stdint.h>

#include "base/base.h"

/* elem_bytes: 1 (e4m3 codes, as UINT8) or 2 (bf16); `what` names the operand in errors */
nib_status nib_tmap_rows_sw128(CUtensorMap *m, const void *base, int elem_bytes, int64_t rows, int64_t cols, int64_t ld,
                               int box_rows, const char *what);

/* An N-D (rank 2..5) bf16 tensor read in 128-byte-swizzled boxes whose innermost extent is 64
 * elements (one swizzle row): dims[0] elements innermost (contiguous), strides[i] the bytes between
 * consecutive indices of dimension i + 1 (multiples of 16, non-decreasing), box[0] = 64, box[i] <=
 * 256; zeros for every element outside the tensor. */
nib_status nib_tmap_bf16_sw128(CUtensorMap *m, const void *base, int rank, const int64_t *dims, const int64_t *strides,
                               const int *box, const char *what);

#endif
