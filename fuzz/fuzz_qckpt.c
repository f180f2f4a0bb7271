/* fuzz_qckpt.c — libFuzzer harness for the quantized-checkpoint loader (io/qcheckpoint.c).
 *
 * The input is a safetensors file (libFuzzer's exact-size heap copy). When it opens, the harness
 * reads its quantization config, builds the layer index (nib_qckpt_index_build), imports every
 * detected layer, and every "<base>.weight" as a FLOAT or quantized layer, through
 * nib_qckpt_get_linear_ex with the element scan and the fp32 dequantization on (the most code),
 * then once more with VALIDATE_ONLY, scans every tensor (nib_qckpt_scan_tensor) and checks the
 * index's owner map. When it does not open, the same bytes go to nib_qckpt_config_parse (the
 * quantization-config reader gets junk too). Properties: every failure is a status other than
 * NIB_OK / NIB_ERR_INTERNAL with a message; an imported layer has N, K >= 1, a nib_wsrc that
 * passes nib_wsrc_validate, and (zero copy) data inside the input.
 *
 * Build and run: make fuzz FUZZ_SECONDS=60 (fuzz/fuzz.mk; seeds from fuzz/fuzz_seeds.c). */
#include <stdint.h>
#include <string.h>

#include "io/qcheckpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink;

#define PROPERTY(cond)                                                                        \
    do {                                                                                      \
        if (!(cond)) __builtin_trap();                                                        \
    } while (0)

static void check_fail(nib_status st) {
    PROPERTY(st != NIB_ERR_INTERNAL);
    PROPERTY(nib_last_error()[0] != '\0');
    nib_clear_error();
}

/* Import base with the given flags; on success check the description. */
static void import(const nib_st_file *f, const char *base, unsigned flags, const uint8_t *data,
                   size_t size) {
    nib_qckpt_opts o = {flags, NULL};
    nib_qlinear q;
    nib_status st = nib_qckpt_get_linear_ex(f, base, &o, &q);
    if (st != NIB_OK) {
        check_fail(st);
        nib_qlinear_free(&q); /* zeroed on failure: a no-op */
        return;
    }
    if (!(flags & NIB_QCKPT_VALIDATE_ONLY)) {
        PROPERTY(q.w.n >= 1 && q.w.k >= 1);
        PROPERTY(q.info.n == q.w.n && q.info.k == q.w.k);
        if (q.info.layout != NIB_QCKPT_FLOAT) PROPERTY(nib_wsrc_validate(&q.w, base) == NIB_OK);
        if (q.zero_copy && q.w.data) {
            const uint8_t *p = q.w.data;
            PROPERTY(p >= data && p < data + size);
        }
        if (q.f32) {
            uint64_t nk = (uint64_t)q.w.n * (uint64_t)q.w.k;
            float acc = 0;
            for (uint64_t i = 0; i < nk; i++) acc += q.f32[i];
            g_sink += (uint64_t)(acc != acc);
        }
    }
    nib_qlinear_free(&q);
    nib_qlinear_free(&q); /* freeing twice is a no-op (zeroed) */
}

static void walk(const nib_st_file *f, const uint8_t *data, size_t size) {
    nib_qckpt_config cfg;
    nib_status st = nib_qckpt_config_from_file(f, &cfg);
    if (st != NIB_OK) check_fail(st);
    nib_qckpt_index *ix = NULL;
    st = nib_qckpt_index_build(f, NULL, &ix);
    if (st != NIB_OK) {
        check_fail(st);
        PROPERTY(ix == NULL);
    } else {
        for (size_t i = 0; i < nib_qckpt_index_count(ix); i++) {
            const nib_qckpt_entry *e = nib_qckpt_index_at(ix, i);
            PROPERTY(e && e->base && e->problem);
            if (e->status != NIB_OK) {
                PROPERTY(e->status != NIB_ERR_INTERNAL && e->problem[0] != '\0');
                continue;
            }
            PROPERTY(e->info.n_parts >= 1 && e->info.n_parts <= NIB_QCKPT_MAX_PARTS);
            import(f, e->base, NIB_QCKPT_WANT_F32 | NIB_QCKPT_CHECK_ELEMENTS, data, size);
            import(f, e->base, NIB_QCKPT_VALIDATE_ONLY | NIB_QCKPT_CHECK_ELEMENTS, data, size);
        }
        PROPERTY(nib_qckpt_index_at(ix, nib_qckpt_index_count(ix)) == NULL);
        for (size_t i = 0; i < nib_st_count(f); i++) {
            const nib_qckpt_entry *e = nib_qckpt_index_owner(ix, i);
            if (e) PROPERTY(e->status == NIB_OK);
        }
        nib_qckpt_index_free(ix);
    }
    /* FLOAT layers are not indexed: import every "<base>.weight" directly */
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        nib_qckpt_bad bad;
        nib_qckpt_scan_tensor(t, &bad);
        g_sink += bad.count;
        if (t->name_len > 7 && !strcmp(t->name + t->name_len - 7, ".weight")) {
            char base[256];
            if (t->name_len - 7 >= sizeof base) continue;
            memcpy(base, t->name, t->name_len - 7);
            base[t->name_len - 7] = '\0';
            import(f, base, 0, data, size);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nib_st_file *f = NULL;
    nib_status st = nib_st_open_memory(data, size, &f);
    if (st == NIB_OK) {
        walk(f, data, size);
        nib_st_close(f);
    } else {
        nib_clear_error();
        nib_qckpt_config cfg;
        st = nib_qckpt_config_parse((const char *)data, size, &cfg);
        if (st != NIB_OK) check_fail(st);
        else g_sink += (uint64_t)cfg.group_size + (uint64_t)cfg.bits;
    }
    nib_clear_error();
    return 0;
}
