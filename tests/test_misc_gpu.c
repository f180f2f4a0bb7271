/* test_misc_gpu.c — the small CUDA ops of ops/cuda/misc.cu against their reference twins
 * (ops/ref/misc.c): im2patch (F32 NCHW and U8 NHWC camera images), the token embedding gather,
 * the fp32 -> bf16 state conversion, the fp32 accumulate of a bf16 update, and the GEMM epilogue
 * (bias, gate, residual; its GeGLU is covered through the GEMM tests).
 *
 * Every one of these performs the reference's fp32 operations one for one and rounds the result
 * to bf16 once (RNE), so the expected output is the reference's value rounded to bf16 with
 * nib_f32_to_bf16: they must agree exactly (values compared, so +0 and -0 are equal; NaN only
 * with NaN). Outputs are poisoned first (bf16 NaN 0x7FC1) and framed by guard
 * rows and columns that must come back untouched. Shapes are awkward on purpose (odd widths,
 * padded leading dimensions, one image, several images, a patch that is not 14).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "harness.h"
#include "ops/misc.h"
#include "runtime/device.h"

#define PBF16 0x7FC1u /* bf16 NaN with a payload: unwritten outputs and guards */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a device copy of host bytes (host NULL: uninitialized); 0 on failure (recorded) */
static int dup_dev(nib_test_ctx *t, void **d, const void *host, size_t n) {
    *d = NULL;
    nib_status st = nib_dev_malloc(d, n, "test buffer");
    if (!st && host) st = nib_dev_upload(*d, host, n);
    if (st) {
        nib_test_fail(t, __FILE__, __LINE__, "device buffer of %zu bytes: %s", n, nib_last_error());
        return 0;
    }
    return 1;
}
static int back(nib_test_ctx *t, void *host, const void *d, size_t n) {
    nib_status st = nib_dev_sync();
    if (!st) st = nib_dev_download(host, d, n);
    if (st) nib_test_fail(t, __FILE__, __LINE__, "download: %s", nib_last_error());
    return st == NIB_OK;
}

/* one bf16 output against the reference's fp32 value: equal after the reference's rounding */
static int same_bf16(uint16_t got, float ref) {
    const float g = nib_bf16_to_f32(got), w = nib_bf16_to_f32(nib_f32_to_bf16(ref));
    return (isnan(g) && isnan(w)) || g == w;
}

/* ---- im2patch ------------------------------------------------------------------------------ */
static void im2patch_case(nib_test_ctx *t, nib_rng *r, int n_img, int ch, int size, int patch, int ld_extra, int u8) {
    const int g = size / patch, kk = ch * patch * patch;
    const int64_t ld = kk + ld_extra, rows = (int64_t)n_img * g * g, G = 2; /* G guard rows after the output */
    const size_t ne = (size_t)n_img * ch * size * size, nout = (size_t)(rows + G) * ld;
    float *imf = malloc(ne * 4 + 4), *ref = malloc((size_t)rows * ld * 4 + 4);
    uint8_t *im8 = malloc(ne + 1);
    uint16_t *got = malloc(nout * 2);
    void *dimg = NULL, *dout = NULL;
    if (!imf || !ref || !im8 || !got) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    for (size_t i = 0; i < ne; i++) {
        imf[i] = (float)(2.0 * nib_rng_uniform(r) - 1.0);
        im8[i] = (uint8_t)(i < 256 ? i : nib_rng_below(r, 256)); /* every code at least once */
    }
    imf[0] = -1.0f, imf[ne - 1] = 1.0f, imf[ne / 2] = -0.0f;
    for (size_t i = 0; i < nout; i++) got[i] = PBF16;
    nib_im2patch_args a = {u8 ? (const void *)im8 : (const void *)imf, u8, n_img, ch, size, patch, ref, ld};
    CHECK_OK(nib_ref_im2patch(&a));
    if (!dup_dev(t, &dimg, a.images, u8 ? ne : ne * 4) || !dup_dev(t, &dout, got, nout * 2)) goto done;
    a.images = dimg, a.out = dout;
    CHECK_OK(nib_cuda_im2patch(&a, NULL));
    if (!back(t, got, dout, nout * 2)) goto done;
    int64_t bad = 0, guard = 0;
    for (int64_t i = 0; i < rows * ld; i++)
        if (!same_bf16(got[i], ref[i]) && bad++ < 3)
            nib_test_fail(t, __FILE__, __LINE__, "im2patch %s %dx%dx%d patch %d ld %lld: row %lld col %lld got 0x%04x want %.8g",
                          u8 ? "u8" : "f32", n_img, ch, size, patch, (long long)ld, (long long)(i / ld), (long long)(i % ld),
                          got[i], ref[i]);
    for (int64_t i = rows * ld; i < (rows + G) * ld; i++) guard += got[i] != PBF16;
    CHECK_MSG(bad == 0, "im2patch %s: %lld of %lld outputs differ from the reference", u8 ? "u8" : "f32", (long long)bad,
              (long long)(rows * ld));
    CHECK_MSG(guard == 0, "im2patch %s: %lld guard values past the output were written", u8 ? "u8" : "f32",
              (long long)guard);
done:
    nib_dev_free(dimg, u8 ? ne : ne * 4);
    nib_dev_free(dout, nout * 2);
    free(imf), free(ref), free(im8), free(got);
}

NIB_TEST(misc_gpu_im2patch) {
    NIB_REQUIRE_GPU();
    nib_rng r;
    nib_test_rng(t, &r);
    static const int cases[][5] = {
        /* n_img, channels, size, patch, ld - channels * patch^2 */
        {2, 3, 224, 14, 4}, /* Pi0.5's SigLIP: two cameras, 588 columns padded */
        {1, 3, 28, 14, 0},  {3, 1, 20, 5, 3}, {2, 4, 24, 6, 7}, {1, 2, 9, 9, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int u8 = 0; u8 < 2; u8++)
            im2patch_case(t, &r, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], u8);
    /* a size that the patch does not divide, and a short ld, are refused by both */
    float x[16];
    nib_im2patch_args bad = {x, 0, 1, 1, 4, 3, x, 9};
    CHECK_ST(nib_ref_im2patch(&bad), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_cuda_im2patch(&bad, NULL), NIB_ERR_INVALID_ARG);
    nib_im2patch_args shortld = {x, 0, 1, 1, 4, 2, x, 3};
    CHECK_ST(nib_ref_im2patch(&shortld), NIB_ERR_SHAPE);
    CHECK_ST(nib_cuda_im2patch(&shortld, NULL), NIB_ERR_SHAPE);
    CHECK(strstr(nib_last_error(), "ld 3 < 4") != NULL);
    nib_clear_error();
}

/* ---- embedding gather ---------------------------------------------------------------------- */
NIB_TEST(misc_gpu_embed) {
    NIB_REQUIRE_GPU();
    nib_rng r;
    nib_test_rng(t, &r);
    const int64_t vocab = 997, dim = 1029, ld = dim + 5;
    const int32_t n = 19, G = 1; /* one guard row after the output */
    const float scale = 45.254834f; /* ~sqrt(2048), Gemma's embedding scale */
    uint16_t *tab = malloc((size_t)(vocab * dim) * 2), *got = malloc((size_t)((n + G) * ld) * 2);
    float *tabf = malloc((size_t)(vocab * dim) * 4), *ref = malloc((size_t)(n * ld) * 4);
    int32_t ids[19];
    void *dtab = NULL, *dids = NULL, *dout = NULL;
    REQUIRE(tab && got && tabf && ref);
    for (int64_t i = 0; i < vocab * dim; i++) {
        tab[i] = nib_f32_to_bf16((float)nib_rng_normal(&r));
        tabf[i] = nib_bf16_to_f32(tab[i]);
    }
    for (int i = 0; i < n; i++) ids[i] = (int32_t)nib_rng_below(&r, (uint64_t)vocab);
    ids[0] = 0, ids[1] = (int32_t)vocab - 1, ids[2] = ids[3]; /* the ends, and a repeated id */
    const int oor = 7;                                         /* out of range: the GPU writes zeros */
    for (size_t i = 0; i < (size_t)((n + G) * ld); i++) got[i] = PBF16;
    /* the reference on the in-range ids (it rejects the other, naming it) */
    int32_t ok_ids[19];
    memcpy(ok_ids, ids, sizeof ids);
    ok_ids[oor] = 0;
    nib_embed_args a = {tabf, vocab, dim, ok_ids, n, scale, ref, ld};
    CHECK_OK(nib_ref_embed(&a));
    ids[oor] = (int32_t)vocab;
    nib_embed_args e = a;
    e.ids = ids;
    CHECK_ST(nib_ref_embed(&e), NIB_ERR_INVALID_ARG);
    CHECK(strstr(nib_last_error(), "997") != NULL);
    nib_clear_error();
    if (!dup_dev(t, &dtab, tab, (size_t)(vocab * dim) * 2) || !dup_dev(t, &dids, ids, sizeof ids) ||
        !dup_dev(t, &dout, got, (size_t)((n + G) * ld) * 2))
        goto done;
    a.table = dtab, a.ids = dids, a.out = dout;
    CHECK_OK(nib_cuda_embed(&a, NULL));
    if (!back(t, got, dout, (size_t)((n + G) * ld) * 2)) goto done;
    int64_t bad = 0, guard = 0;
    for (int32_t i = 0; i < n; i++)
        for (int64_t j = 0; j < ld; j++) {
            const uint16_t v = got[i * ld + j];
            if (j >= dim) guard += v != PBF16;
            else if (i == oor ? v != 0 : !same_bf16(v, ref[i * ld + j])) {
                if (bad++ < 3)
                    nib_test_fail(t, __FILE__, __LINE__, "embed row %d (id %d) col %lld: got 0x%04x want %.8g", i, ids[i],
                                  (long long)j, v, i == oor ? 0.0 : ref[i * ld + j]);
            }
        }
    for (int64_t j = 0; j < G * ld; j++) guard += got[n * ld + j] != PBF16;
    CHECK_MSG(bad == 0, "embed: %lld outputs differ", (long long)bad);
    CHECK_MSG(guard == 0, "embed: %lld guard values written (columns past dim, the row past n)", (long long)guard);
done:
    nib_dev_free(dtab, (size_t)(vocab * dim) * 2);
    nib_dev_free(dids, sizeof ids);
    nib_dev_free(dout, (size_t)((n + G) * ld) * 2);
    free(tab), free(got), free(tabf), free(ref);
}

/* ---- fp32 state -> bf16, and the fp32 accumulate of a bf16 update ---------------------------- */
NIB_TEST(misc_gpu_f32_state) {
    NIB_REQUIRE_GPU();
    nib_rng r;
    nib_test_rng(t, &r);
    const int64_t rows = 17, cols = 1031, ldx = 1037, ldy = 1043, ldv = 1035;
    const size_t nx = (size_t)((rows + 1) * ldx), ny = (size_t)((rows + 1) * ldy), nv = (size_t)(rows * ldv);
    float *x = malloc(nx * 4), *ref = malloc(nx * 4), *gx = malloc(nx * 4), *vf = malloc(nv * 4);
    uint16_t *gy = malloc(ny * 2), *v = malloc(nv * 2);
    void *dx = NULL, *dy = NULL, *dv = NULL;
    REQUIRE(x && ref && gx && vf && gy && v);
    /* magnitudes 2^-30 .. 2^30, and the cases where rounding to bf16 is decided: ties to even both
     * ways, a subnormal, zeros of both signs, the largest float (rounds to Inf), Inf, NaN */
    for (size_t i = 0; i < nx; i++) x[i] = (float)(ldexp(nib_rng_normal(&r), (int)nib_rng_below(&r, 61) - 30));
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0x1p-140f, -0.0f, 0.0f,
                             FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN, 0x1.fffffep-127f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[(i * 97) % (size_t)cols] = special[i];
    for (size_t i = 0; i < ny; i++) gy[i] = PBF16;
    for (size_t i = 0; i < nv; i++) {
        v[i] = nib_f32_to_bf16((float)nib_rng_normal(&r));
        vf[i] = nib_bf16_to_f32(v[i]);
    }
    if (!dup_dev(t, &dx, x, nx * 4) || !dup_dev(t, &dy, gy, ny * 2) || !dup_dev(t, &dv, v, nv * 2)) goto done;
    /* f32 -> act: the reference writes floats (the host's act dtype); the GPU rounds to bf16 */
    CHECK_OK(nib_ref_f32_to_act(x, rows, cols, ldx, ref, ldx));
    CHECK_OK(nib_cuda_f32_to_act(dx, rows, cols, ldx, dy, ldy, NULL));
    if (!back(t, gy, dy, ny * 2)) goto done;
    int64_t bad = 0, guard = 0;
    for (int64_t i = 0; i <= rows; i++)
        for (int64_t j = 0; j < ldy; j++) {
            const uint16_t g = gy[i * ldy + j];
            if (i == rows || j >= cols) guard += g != PBF16;
            else if (!same_bf16(g, ref[i * ldx + j]) && bad++ < 3)
                nib_test_fail(t, __FILE__, __LINE__, "f32_to_act row %lld col %lld: %.9g -> 0x%04x, want 0x%04x",
                              (long long)i, (long long)j, ref[i * ldx + j], g, nib_f32_to_bf16(ref[i * ldx + j]));
        }
    CHECK_MSG(bad == 0, "f32_to_act: %lld values rounded differently", (long long)bad);
    CHECK_MSG(guard == 0, "f32_to_act: %lld guard values written", (long long)guard);
    /* x += v in fp32: bit for bit, guards (columns past cols, the last row) unchanged; the specials
     * above stay in x (Inf + v = Inf, NaN stays NaN) */
    memcpy(ref, x, nx * 4);
    CHECK_OK(nib_ref_axpy_f32(ref, rows, cols, ldx, vf, ldv));
    CHECK_OK(nib_cuda_axpy_f32(dx, rows, cols, ldx, dv, ldv, NULL));
    if (!back(t, gx, dx, nx * 4)) goto done;
    bad = 0;
    for (size_t i = 0; i < nx; i++) {
        const int same = f2u(gx[i]) == f2u(ref[i]) || (isnan(gx[i]) && isnan(ref[i]));
        if (!same && bad++ < 3)
            nib_test_fail(t, __FILE__, __LINE__, "axpy_f32 element %zu: got %.9g want %.9g", i, gx[i], ref[i]);
    }
    CHECK_MSG(bad == 0, "axpy_f32: %lld values differ (guards included)", (long long)bad);
done:
    nib_dev_free(dx, nx * 4);
    nib_dev_free(dy, ny * 2);
    nib_dev_free(dv, nv * 2);
    free(x), free(ref), free(gx), free(vf), free(gy), free(v);
}

/* ---- the GEMM epilogue (bias, gate, residual) --------------------------------------------- */
static void epilogue_case(nib_test_ctx *t, nib_rng *r, int64_t rows, int64_t n, int bias, int gate, int res,
                          int inplace) {
    const int64_t lda = n + 8, ldy = n + 16, R = rows + 1; /* one guard row */
    const size_t na = (size_t)(rows * lda), ny = (size_t)(R * ldy);
    uint16_t *acc = malloc(na * 2), *rb = malloc(ny * 2), *got = malloc(ny * 2);
    float *accf = malloc(na * 4), *resf = malloc(ny * 4), *ref = malloc(ny * 4), *pb = malloc((size_t)n * 4),
          *pg = malloc((size_t)n * 4);
    void *dacc = NULL, *dres = NULL, *dy = NULL, *db = NULL, *dg = NULL;
    if (!(acc && rb && got && accf && resf && ref && pb && pg)) {
        nib_test_fail(t, __FILE__, __LINE__, "host allocation");
        goto done;
    }
    for (size_t i = 0; i < na; i++) {
        acc[i] = nib_f32_to_bf16((float)ldexp(nib_rng_normal(r), (int)nib_rng_below(r, 9) - 4));
        accf[i] = nib_bf16_to_f32(acc[i]);
    }
    acc[0] = 0x8000u, accf[0] = -0.0f; /* -0 + no bias: the sign of zero is all that may differ */
    for (size_t i = 0; i < ny; i++) {
        rb[i] = nib_f32_to_bf16((float)nib_rng_normal(r));
        resf[i] = nib_bf16_to_f32(rb[i]);
        got[i] = PBF16;
    }
    for (int64_t j = 0; j < n; j++) pb[j] = (float)nib_rng_normal(r), pg[j] = (float)(0.5 * nib_rng_normal(r));
    /* in place: y is the residual (its guards are the residual's own values) */
    if (inplace) memcpy(got, rb, ny * 2);
    if (inplace) memcpy(ref, resf, ny * 4);
    nib_epilogue_args a = {accf, rows, n, lda, bias ? pb : NULL, 0, gate ? pg : NULL, res ? (inplace ? ref : resf) : NULL,
                           ldy, ref, ldy};
    CHECK_OK(nib_ref_epilogue(&a));
    if (!dup_dev(t, &dacc, acc, na * 2) || !dup_dev(t, &dy, got, ny * 2) || !dup_dev(t, &db, pb, (size_t)n * 4) ||
        !dup_dev(t, &dg, pg, (size_t)n * 4) || (res && !inplace && !dup_dev(t, &dres, rb, ny * 2)))
        goto done;
    a.acc = dacc, a.y = dy, a.bias = bias ? db : NULL, a.gate = gate ? dg : NULL;
    a.residual = res ? (inplace ? dy : dres) : NULL;
    CHECK_OK(nib_cuda_epilogue(&a, NULL));
    if (!back(t, got, dy, ny * 2)) goto done;
    int64_t bad = 0, guard = 0;
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < ldy; j++) {
            const uint16_t g = got[i * ldy + j], want_guard = inplace ? rb[i * ldy + j] : PBF16;
            if (i == rows || j >= n) guard += g != want_guard;
            else if (!same_bf16(g, ref[i * ldy + j]) && bad++ < 3)
                nib_test_fail(t, __FILE__, __LINE__,
                              "epilogue %lldx%lld bias %d gate %d residual %d in place %d: row %lld col %lld got %.8g want %.8g",
                              (long long)rows, (long long)n, bias, gate, res, inplace, (long long)i, (long long)j,
                              nib_bf16_to_f32(g), ref[i * ldy + j]);
        }
    CHECK_MSG(bad == 0, "epilogue %lldx%lld: %lld outputs differ", (long long)rows, (long long)n, (long long)bad);
    CHECK_MSG(guard == 0, "epilogue %lldx%lld: %lld guard values changed", (long long)rows, (long long)n, (long long)guard);
done:
    nib_dev_free(dacc, na * 2);
    nib_dev_free(dres, ny * 2);
    nib_dev_free(dy, ny * 2);
    nib_dev_free(db, (size_t)n * 4);
    nib_dev_free(dg, (size_t)n * 4);
    free(acc), free(rb), free(got), free(accf), free(resf), free(ref), free(pb), free(pg);
}

NIB_TEST(misc_gpu_epilogue) {
    NIB_REQUIRE_GPU();
    nib_rng r;
    nib_test_rng(t, &r);
    /* 264 columns: the 16-byte vector path; 257: the scalar path */
    static const int64_t shapes[][2] = {{5, 264}, {3, 257}, {1, 8}, {17, 1031}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        epilogue_case(t, &r, shapes[s][0], shapes[s][1], 1, 1, 1, 0);
        epilogue_case(t, &r, shapes[s][0], shapes[s][1], 1, 1, 1, 1);
        epilogue_case(t, &r, shapes[s][0], shapes[s][1], 0, 1, 0, 0);
        epilogue_case(t, &r, shapes[s][0], shapes[s][1], 1, 0, 1, 1);
        epilogue_case(t, &r, shapes[s][0], shapes[s][1], 0, 0, 0, 0);
    }
}
