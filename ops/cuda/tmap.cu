/* tmap.cu — the 2-D TMA tensor-map encoder shared by nib's wgmma kernels (see tmap.h). */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "ops/cuda/tmap.h"
#include "runtime/cuda_check.h"

static PFN_cuTensorMapEncodeTiled_v12000 g_encode;

/* the driver's encoder, through the runtime (nib links no libcuda) */
static nib_status encoder_ready(void) {
    if (g_encode) return NIB_OK;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    NIB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn)
        return NIB_ERR(NIB_ERR_UNSUPPORTED_DEVICE, "tensor map: the driver has no cuTensorMapEncodeTiled (status %d)",
                       (int)q);
    g_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    return NIB_OK;
}

nib_status nib_tmap_rows_sw128(CUtensorMap *m, const void *base, int elem_bytes, int64_t rows, int64_t cols, int64_t ld,
                               int box_rows, const char *what) {
    NIB_RETURN_IF_ERR(encoder_ready());
    if ((elem_bytes != 1 && elem_bytes != 2) || ((uintptr_t)base % 16) || (ld * elem_bytes) % 16 || ld < cols ||
        box_rows < 1 || box_rows > 256)
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "tensor map for %s: %d-byte elements, row pitch %lld elements (%lld columns), base %p, box of "
                       "%d rows (needs 16-byte aligned rows and base, 1..256 box rows)",
                       what, elem_bytes, (long long)ld, (long long)cols, base, box_rows);
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)(ld * elem_bytes)};
    const cuuint32_t box[2] = {(cuuint32_t)(128 / elem_bytes), (cuuint32_t)box_rows}, estr[2] = {1, 1};
    const CUtensorMapDataType dt = elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUresult r = g_encode(m, dt, 2, const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return NIB_ERR(NIB_ERR_CUDA, "tensor map for %s (%lld x %lld, box %d rows) failed: cuTensorMapEncodeTiled %d",
                       what, (long long)rows, (long long)cols, box_rows, (int)r);
    return NIB_OK;
}

nib_status nib_tmap_bf16_sw128(CUtensorMap *m, const void *base, int rank, const int64_t *dims, const int64_t *strides,
                               const int *box, const char *what) {
    NIB_RETURN_IF_ERR(encoder_ready());
    if (rank < 2 || rank > 5 || ((uintptr_t)base % 16) || box[0] != 64)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor map for %s: rank %d, base %p, inner box %d (rank 2..5, a 16-byte "
                       "aligned base, 64 inner elements)", what, rank, base, box[0]);
    cuuint64_t gd[5], gs[4];
    cuuint32_t bx[5], es[5];
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 1 || box[i] < 1 || box[i] > 256)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor map for %s: dimension %d of %lld elements, box %d", what, i,
                           (long long)dims[i], box[i]);
        gd[i] = (cuuint64_t)dims[i];
        bx[i] = (cuuint32_t)box[i];
        es[i] = 1;
        if (i > 0) {
            if (strides[i - 1] % 16 || (i > 1 && strides[i - 1] < strides[i - 2]))
                return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor map for %s: stride %d of %lld bytes (multiples of 16, "
                               "non-decreasing)", what, i, (long long)strides[i - 1]);
            gs[i - 1] = (cuuint64_t)strides[i - 1];
        }
    }
    const CUresult r = g_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, const_cast<void *>(base), gd, gs, bx,
                                es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return NIB_ERR(NIB_ERR_CUDA, "tensor map for %s (rank %d) failed: cuTensorMapEncodeTiled %d", what, rank, (int)r);
    return NIB_OK;
}
