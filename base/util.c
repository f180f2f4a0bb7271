/* util.c — host allocation with error reporting, clock, small-file reading, shape products. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base.h"

bool nib_shape_numel_overflow(const int64_t *shape, int n, uint64_t *out) {
    uint64_t p = 1;
    for (int i = 0; i < n; i++) {
        if (shape[i] < 0) return true;
        if (nib_mul_overflow_u64(p, (uint64_t)shape[i], &p)) return true;
    }
    *out = p;
    return false;
}

void *nib_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", n);
    return p;
}

void *nib_calloc(size_t count, size_t size) {
    size_t total;
    if (nib_mul_overflow_size(count, size, &total)) {
        NIB_ERR(NIB_ERR_OVERFLOW, "host allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = calloc(total ? total : 1, 1);
    if (!p) NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", total);
    return p;
}

void *nib_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) NIB_ERR(NIB_ERR_OUT_OF_MEMORY, "host reallocation to %zu bytes failed", n);
    return q;
}

void nib_free(void *p) { free(p); }

char *nib_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = nib_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

double nib_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* exponent all ones: Inf or NaN */
#define NIB_NONFINITE_BITS 0x7F800000u
static uint32_t copy_finite_portable(float *dst, const float *src, uint64_t n) {
    uint32_t bad = 0;
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8) { /* 8-value blocks the compiler vectorizes */
        uint32_t u[8];
        memcpy(u, src + j, sizeof u);
        for (int k = 0; k < 8; k++) bad |= (u[k] & NIB_NONFINITE_BITS) == NIB_NONFINITE_BITS;
        memcpy(dst + j, u, sizeof u);
    }
    for (; j < n; j++) {
        uint32_t u;
        memcpy(&u, src + j, 4);
        bad |= (u & NIB_NONFINITE_BITS) == NIB_NONFINITE_BITS;
        memcpy(dst + j, &u, 4);
    }
    return bad;
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* AVX2: 32 values per iteration, streamed to a 32-byte aligned destination (the head up to that
 * alignment and the tail go through the portable loop), then one sfence so the stores are
 * ordered before whatever hands the buffer on (a DMA copy enqueued afterwards). */
__attribute__((target("avx2"))) static uint32_t copy_finite_avx2(float *dst, const float *src, uint64_t n) {
    uint64_t head = (uint64_t)((32 - ((uintptr_t)dst & 31)) & 31);
    if (head % 4 || head / 4 > n) return copy_finite_portable(dst, src, n); /* dst not even 4-aligned, or short */
    head /= 4;
    uint32_t bad = copy_finite_portable(dst, src, head);
    const __m256i m = _mm256_set1_epi32((int)NIB_NONFINITE_BITS);
    __m256i acc = _mm256_setzero_si256();
    uint64_t j = head;
    for (; j + 32 <= n; j += 32) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(src + j));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + j + 8));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(src + j + 16));
        const __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(src + j + 24));
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(a, m), m));
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(b, m), m));
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(c, m), m));
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(d, m), m));
        _mm256_stream_si256((__m256i *)(void *)(dst + j), a);
        _mm256_stream_si256((__m256i *)(void *)(dst + j + 8), b);
        _mm256_stream_si256((__m256i *)(void *)(dst + j + 16), c);
        _mm256_stream_si256((__m256i *)(void *)(dst + j + 24), d);
    }
    _mm_sfence();
    bad |= (uint32_t)!_mm256_testz_si256(acc, acc);
    return bad | copy_finite_portable(dst + j, src + j, n - j);
}
#endif

bool nib_copy_finite_f32(float *dst, const float *src, uint64_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (n >= 64 && __builtin_cpu_supports("avx2")) {
        const char *e = getenv("NIB_COPY_AVX2"); /* 0: the portable loop (tests, A/B) */
        if (!(e && !strcmp(e, "0"))) return copy_finite_avx2(dst, src, n) == 0;
    }
#endif
    return copy_finite_portable(dst, src, n) == 0;
}

static int cmp_double_asc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
void nib_sort_doubles(double *v, size_t n) {
    if (n > 1) qsort(v, n, sizeof *v, cmp_double_asc);
}

double nib_quantile_sorted(const double *v, size_t n, double q) {
    if (!n) return 0.0;
    /* rank = ceil(q * n) (1-based), at least 1; the small slack keeps e.g. 0.99 * 100 from landing
     * on 100 by the product's rounding */
    double r = ceil(q * (double)n - 1e-9);
    size_t i = r < 1.0 ? 0 : (size_t)r - 1;
    return v[i < n ? i : n - 1];
}

int nib_cpu_count(void) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    return nc < 1 ? 1 : nc > 64 ? 64 : (int)nc;
}

typedef struct pf_job {
    void (*fn)(void *, int64_t, int64_t);
    void *ctx;
    int64_t b, e;
} pf_job;

static void *pf_worker(void *arg) {
    pf_job *j = (pf_job *)arg;
    j->fn(j->ctx, j->b, j->e);
    return NULL;
}

void nib_parallel_for(int64_t n, int threads, int64_t min_chunk, void (*fn)(void *ctx, int64_t begin, int64_t end),
                      void *ctx) {
    if (n <= 0) return;
    if (threads <= 0) threads = nib_cpu_count();
    if (threads > 64) threads = 64;
    if (min_chunk < 1) min_chunk = 1;
    int64_t chunks = (n + min_chunk - 1) / min_chunk;
    if (chunks > threads) chunks = threads;
    if (chunks <= 1) {
        fn(ctx, 0, n);
        return;
    }
    pf_job jobs[64];
    pthread_t tid[64];
    int started[64];
    const int64_t per = (n + chunks - 1) / chunks;
    int nj = 0;
    for (int64_t b = 0; b < n; b += per) {
        jobs[nj] = (pf_job){fn, ctx, b, b + per < n ? b + per : n};
        nj++;
    }
    for (int i = 1; i < nj; i++) started[i] = pthread_create(&tid[i], NULL, pf_worker, &jobs[i]) == 0;
    pf_worker(&jobs[0]);
    for (int i = 1; i < nj; i++) {
        if (started[i]) pthread_join(tid[i], NULL);
        else pf_worker(&jobs[i]); /* no thread: run it here */
    }
}

nib_status nib_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len) {
    nib_status st = NIB_OK;
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NIB_ERR(NIB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    buf = nib_malloc(cap + 1);
    if (!buf) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= max_bytes) {
                st = NIB_ERR(NIB_ERR_FORMAT, "'%s' is larger than the %zu-byte limit", path,
                             max_bytes);
                goto fail;
            }
            size_t ncap = cap * 2 > max_bytes ? max_bytes : cap * 2;
            char *nb = nib_realloc(buf, ncap + 1);
            if (!nb) {
                st = NIB_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                st = NIB_ERR(NIB_ERR_IO, "read error on '%s': %s", path, strerror(errno));
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return NIB_OK;
fail:
    if (f) fclose(f);
    nib_free(buf);
    return st;
}
