/* tensor.c — dtype table and overflow-checked tensor descriptors. */
#include <string.h>

#include "base.h"

static const struct {
    const char *name;
    size_t size;
} k_dtypes[NIB_DTYPE_COUNT] = {
    [NIB_DTYPE_INVALID] = {"INVALID", 0}, [NIB_DTYPE_BOOL] = {"BOOL", 1},
    [NIB_DTYPE_U8] = {"U8", 1},           [NIB_DTYPE_I8] = {"I8", 1},
    [NIB_DTYPE_U16] = {"U16", 2},         [NIB_DTYPE_I16] = {"I16", 2},
    [NIB_DTYPE_U32] = {"U32", 4},         [NIB_DTYPE_I32] = {"I32", 4},
    [NIB_DTYPE_U64] = {"U64", 8},         [NIB_DTYPE_I64] = {"I64", 8},
    [NIB_DTYPE_F16] = {"F16", 2},         [NIB_DTYPE_BF16] = {"BF16", 2},
    [NIB_DTYPE_F32] = {"F32", 4},         [NIB_DTYPE_F64] = {"F64", 8},
    [NIB_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [NIB_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [NIB_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
};

size_t nib_dtype_size(nib_dtype dt) {
    if ((unsigned)dt >= NIB_DTYPE_COUNT) return 0;
    return k_dtypes[dt].size;
}

const char *nib_dtype_name(nib_dtype dt) {
    if ((unsigned)dt >= NIB_DTYPE_COUNT) return "INVALID";
    return k_dtypes[dt].name;
}

nib_dtype nib_dtype_from_name(const char *s, size_t n) {
    for (int i = 1; i < NIB_DTYPE_COUNT; i++) {
        const char *nm = k_dtypes[i].name;
        if (strlen(nm) == n && memcmp(nm, s, n) == 0) return (nib_dtype)i;
    }
    return NIB_DTYPE_INVALID;
}

/* Largest byte count a descriptor may describe: keeps every later (int64) offset safe. */
#define NIB_MAX_TENSOR_BYTES ((uint64_t)INT64_MAX)

static nib_status check_common(nib_tensor_desc *d, nib_dtype dt, int32_t ndim,
                               const int64_t *shape) {
    if (!d) return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: NULL descriptor");
    if (nib_dtype_size(dt) == 0)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: invalid dtype %d", (int)dt);
    if (ndim < 0 || ndim > NIB_MAX_DIMS)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: ndim %d outside 0..%d", (int)ndim,
                       NIB_MAX_DIMS);
    if (ndim > 0 && !shape) return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: NULL shape");
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: dim %d is negative (%lld)", i,
                           (long long)shape[i]);
    return NIB_OK;
}

nib_status nib_tensor_desc_init(nib_tensor_desc *d, nib_dtype dt, int32_t ndim,
                                const int64_t *shape) {
    NIB_RETURN_IF_ERR(check_common(d, dt, ndim, shape));
    nib_tensor_desc t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    uint64_t numel;
    if (nib_shape_numel_overflow(shape, ndim, &numel))
        return NIB_ERR(NIB_ERR_OVERFLOW, "tensor desc: element count of %d-dim shape overflows",
                       (int)ndim);
    uint64_t nbytes;
    if (nib_mul_overflow_u64(numel, nib_dtype_size(dt), &nbytes) || nbytes > NIB_MAX_TENSOR_BYTES)
        return NIB_ERR(NIB_ERR_OVERFLOW, "tensor desc: %llu elements of %s overflow the byte count",
                       (unsigned long long)numel, nib_dtype_name(dt));
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        /* zero dims are skipped so strides stay meaningful; an empty tensor with huge other
         * dims can still overflow here, which is an error like any other */
        if (shape[i] != 0 && __builtin_mul_overflow(stride, shape[i], &stride))
            return NIB_ERR(NIB_ERR_OVERFLOW, "tensor desc: stride of dim %d overflows", i);
    }
    t.numel = numel;
    t.nbytes = nbytes;
    *d = t;
    return NIB_OK;
}

nib_status nib_tensor_desc_init_strided(nib_tensor_desc *d, nib_dtype dt, int32_t ndim,
                                        const int64_t *shape, const int64_t *strides) {
    NIB_RETURN_IF_ERR(check_common(d, dt, ndim, shape));
    if (ndim > 0 && !strides) return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: NULL strides");
    nib_tensor_desc t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    uint64_t numel;
    if (nib_shape_numel_overflow(shape, ndim, &numel))
        return NIB_ERR(NIB_ERR_OVERFLOW, "tensor desc: element count overflows");
    /* highest element index = sum (shape_i - 1) * stride_i */
    uint64_t hi = 0;
    for (int i = 0; i < ndim; i++) {
        if (strides[i] < 0)
            return NIB_ERR(NIB_ERR_INVALID_ARG, "tensor desc: stride %d is negative", i);
        t.shape[i] = shape[i];
        t.strides[i] = strides[i];
        if (shape[i] == 0) continue;
        uint64_t span;
        if (nib_mul_overflow_u64((uint64_t)(shape[i] - 1), (uint64_t)strides[i], &span) ||
            nib_add_overflow_u64(hi, span, &hi))
            return NIB_ERR(NIB_ERR_OVERFLOW, "tensor desc: strided extent overflows at dim %d", i);
    }
    uint64_t nbytes = 0;
    if (numel > 0) {
        uint64_t count;
        if (nib_add_overflow_u64(hi, 1, &count) ||
            nib_mul_overflow_u64(count, nib_dtype_size(dt), &nbytes) ||
            nbytes > NIB_MAX_TENSOR_BYTES)
            return NIB_ERR(NIB_ERR_OVERFLOW, "tensor desc: strided byte extent overflows");
    }
    t.numel = numel;
    t.nbytes = nbytes;
    *d = t;
    return NIB_OK;
}

int nib_tensor_desc_is_contiguous(const nib_tensor_desc *d) {
    int64_t stride = 1;
    for (int i = d->ndim - 1; i >= 0; i--) {
        if (d->shape[i] != 1 && d->strides[i] != stride) return 0;
        if (d->shape[i] != 0) stride *= d->shape[i];
    }
    return 1;
}
