/* base.h — internal foundation shared by every layer: errors, logging, checked size arithmetic,
 * small host helpers. Only base/ is below this; everything else may include it. */
#ifndef NIB_BASE_H
#define NIB_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nib.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define NIB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define NIB_UNUSED __attribute__((unused))
#define NIB_NODISCARD __attribute__((warn_unused_result))
#else
#define NIB_PRINTF(a, b)
#define NIB_UNUSED
#define NIB_NODISCARD
#endif

#define NIB_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- errors ----------------------------------------------------------------------------- */
/* Record `st` with a formatted message for nib_last_error() and return `st`. The message is
 * prefixed with nothing; the macro NIB_ERR appends " (file:line)". Thread-local storage. */
nib_status nib_set_error(nib_status st, const char *file, int line, const char *fmt, ...)
    NIB_PRINTF(4, 5);
nib_status nib_set_errorv(nib_status st, const char *file, int line, const char *fmt,
                          va_list ap);
/* Prepend context to the current message: "loading 'x': <old message>". Returns st. */
nib_status nib_error_context(nib_status st, const char *fmt, ...) NIB_PRINTF(2, 3);

#define NIB_ERR(st, ...) nib_set_error((st), __FILE__, __LINE__, __VA_ARGS__)
/* Evaluate a nib_status expression; on failure jump to `fail` with `st` set. Needs a local
 * `nib_status st` and a `fail:` label (the one cleanup path of the function). */
#define NIB_TRY(expr)                                                                         \
    do {                                                                                      \
        st = (expr);                                                                          \
        if (st != NIB_OK) goto fail;                                                          \
    } while (0)
/* Return the status of `expr` if it is not NIB_OK (for functions with nothing to clean up). */
#define NIB_RETURN_IF_ERR(expr)                                                               \
    do {                                                                                      \
        nib_status nib_rie_st_ = (expr);                                                      \
        if (nib_rie_st_ != NIB_OK) return nib_rie_st_;                                        \
    } while (0)

/* ---- logging ---------------------------------------------------------------------------- */
void nib_log(nib_log_level lvl, const char *fmt, ...) NIB_PRINTF(2, 3);
#define NIB_LOGE(...) nib_log(NIB_LOG_ERROR, __VA_ARGS__)
#define NIB_LOGW(...) nib_log(NIB_LOG_WARN, __VA_ARGS__)
#define NIB_LOGI(...) nib_log(NIB_LOG_INFO, __VA_ARGS__)
#define NIB_LOGD(...) nib_log(NIB_LOG_DEBUG, __VA_ARGS__)

/* ---- checked size arithmetic -------------------------------------------------------------
 * Each returns true on overflow (result untouched) and false on success, like the GCC
 * builtins. Use for every size or offset derived from untrusted input. */
static inline bool nib_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool nib_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool nib_add_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool nib_mul_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
/* Round x up to a multiple of `align` (align > 0); true on overflow. */
static inline bool nib_pad_overflow_u64(uint64_t x, uint64_t align, uint64_t *out) {
    uint64_t t;
    if (align == 0) return true;
    if (__builtin_add_overflow(x, align - 1, &t)) return true;
    *out = t - t % align;
    return false;
}
/* Checked product of n non-negative int64 dims into uint64 (true on overflow or negative). */
bool nib_shape_numel_overflow(const int64_t *shape, int n, uint64_t *out);

/* ---- host memory -------------------------------------------------------------------------
 * Allocation helpers that record NIB_ERR_OUT_OF_MEMORY with the size on failure. */
void *nib_malloc(size_t n);                 /* NULL + error on failure; n = 0 gives 1 byte */
void *nib_calloc(size_t count, size_t size); /* overflow-checked */
void *nib_realloc(void *p, size_t n);
void nib_free(void *p);                      /* NULL is a no-op */
char *nib_strdup(const char *s);

/* ---- misc --------------------------------------------------------------------------------- */
/* Monotonic clock in seconds. */
double nib_now_s(void);
/* Copies n fp32 values (any alignment, no overlap) and returns whether all are finite (no Inf or
 * NaN), reading each source value once. On x86-64 CPUs with AVX2 the copy uses non-temporal
 * stores (for staging buffers the CPU does not read back, e.g. page-locked memory a GPU copies
 * from: no read for ownership, no cache pollution); elsewhere a fused 8-value loop. */
bool nib_copy_finite_f32(float *dst, const float *src, uint64_t n);
/* Sorts v[0..n) ascending in place (qsort). */
void nib_sort_doubles(double *v, size_t n);
/* The q-quantile (0 <= q <= 1) of n >= 1 ascending values by the nearest-rank rule: the smallest
 * value with at least q * n values at or below it (q = 0: the minimum, q = 1: the maximum). */
double nib_quantile_sorted(const double *v, size_t n, double q);
/* Online CPUs (at least 1, at most 64). */
int nib_cpu_count(void);
/* Runs fn(ctx, begin, end) over [0, n) cut into at most `threads` contiguous chunks of at least
 * `min_chunk` items, on threads (the calling thread takes one chunk); returns when all are done.
 * threads <= 0: nib_cpu_count(). fn must not fail (collect errors in ctx). */
void nib_parallel_for(int64_t n, int threads, int64_t min_chunk, void (*fn)(void *ctx, int64_t begin, int64_t end),
                      void *ctx);
/* Reads a whole small file (e.g. a config); caps the size at max_bytes. */
nib_status nib_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif /* NIB_BASE_H */
