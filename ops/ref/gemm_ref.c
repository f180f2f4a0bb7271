/* gemm_ref.c — reference weight GEMM: exact fp64 dequantization (ops/gemm.c), fp64
 * accumulation, fp64 epilogue. The spec the CUDA kernels are tested against. */
#include <math.h>
#include <string.h>

#include "formats/formats.h"
#include "ops/gemm.h"

static double gelu_tanh64(double x) {
    const double k0 = 0.7978845608028654, k1 = 0.044715;
    return 0.5 * x * (1.0 + tanh(k0 * (x + k1 * x * x * x)));
}

/* weight rows [r0, r1): dequantized into a buffer of the chunk's own, then every input row's dot
 * product in fp64; a chunk writes only its own columns of acc / abs_acc, and each output's
 * operations do not depend on the chunking (so the result is bitwise the serial one) */
typedef struct ref_gemm_job {
    const nib_wsrc *w;
    const double *xr;
    int64_t m, k;
    double *acc, *abs_acc;
    int failed;
} ref_gemm_job;
static void ref_gemm_rows(void *jp, int64_t r0, int64_t r1) {
    ref_gemm_job *j = (ref_gemm_job *)jp;
    const nib_wsrc *w = j->w;
    const int64_t m = j->m, k = j->k;
    double *wr = nib_malloc((size_t)(k ? k : 1) * sizeof(double));
    if (!wr) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        nib_wsrc_dequant_row64(w, r, wr);
        double b = w->bias ? (double)w->bias[r] : 0.0;
        for (int64_t i = 0; i < m; i++) {
            double s = 0.0, a = 0.0;
            const double *xi = j->xr + i * k;
            for (int64_t q = 0; q < k; q++) {
                double t = wr[q] * xi[q];
                s += t;
                a += fabs(t);
            }
            j->acc[i * w->n + r] = s + b;
            j->abs_acc[i * w->n + r] = a + fabs(b);
        }
    }
    nib_free(wr);
}

nib_status nib_ref_gemm(const nib_wsrc *w, const uint16_t *x, int64_t m, int64_t ldx,
                        const nib_gemm_epi *epi, double *y64, double *abs_terms) {
    NIB_RETURN_IF_ERR(nib_wsrc_validate(w, "ref gemm"));
    if (m < 0 || ldx < w->k) return NIB_ERR(NIB_ERR_SHAPE, "ref gemm: m %lld, ldx %lld < K %lld", (long long)m, (long long)ldx, (long long)w->k);
    const int geglu = epi && epi->geglu;
    if (geglu && (w->n % 2)) return NIB_ERR(NIB_ERR_SHAPE, "ref gemm: GeGLU needs an even row count");
    const int64_t n_out = geglu ? w->n / 2 : w->n, k = w->k;
    nib_status st = NIB_OK;
    double *xr = NULL, *acc = NULL, *abs_acc = NULL;
    xr = nib_malloc((size_t)(m ? m : 1) * (size_t)k * sizeof(double));
    acc = nib_malloc((size_t)(m ? m : 1) * (size_t)w->n * sizeof(double));
    abs_acc = nib_malloc((size_t)(m ? m : 1) * (size_t)w->n * sizeof(double));
    if (!xr || !acc || !abs_acc) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < k; j++) xr[i * k + j] = nib_bf16_to_f32(x[i * ldx + j]);
    {
        /* weight rows on threads where a chunk is at least ~4 M multiply-adds */
        ref_gemm_job job = {w, xr, m, k, acc, abs_acc, 0};
        const int64_t per_row = (m ? m : 1) * (k ? k : 1);
        int64_t min_rows = ((int64_t)1 << 22) / per_row;
        if (min_rows < 1) min_rows = 1;
        if (w->n <= min_rows) ref_gemm_rows(&job, 0, w->n);
        else nib_parallel_for(w->n, 0, min_rows, ref_gemm_rows, &job);
        if (job.failed) {
            st = NIB_ERR_OUT_OF_MEMORY;
            goto fail;
        }
    }
    for (int64_t i = 0; i < m; i++) {
        for (int64_t n = 0; n < n_out; n++) {
            double v, a;
            if (geglu) {
                double g = acc[i * w->n + n], u = acc[i * w->n + n_out + n];
                v = gelu_tanh64(g) * u;
                a = fmax(abs_acc[i * w->n + n], abs_acc[i * w->n + n_out + n]);
            } else {
                v = acc[i * w->n + n];
                a = abs_acc[i * w->n + n];
            }
            if (epi && epi->gate) v *= (double)epi->gate[n];
            if (epi && epi->residual)
                v += (double)nib_bf16_to_f32(((const uint16_t *)epi->residual)[i * epi->ldr + n]);
            y64[i * n_out + n] = v;
            if (abs_terms) abs_terms[i * n_out + n] = a;
        }
    }
fail:
    nib_free(xr);
    nib_free(acc);
    nib_free(abs_acc);
    return st;
}
