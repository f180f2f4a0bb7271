/* fuzz_safetensors.c — libFuzzer harness for the safetensors reader (io/safetensors.c).
 *
 * The input is a whole file, given to nib_st_open_memory from a heap block of exactly its size
 * (libFuzzer's own copy), so ASan reports any read past the end of the file. On success every
 * accessor is exercised and every tensor's data bytes are read (a checksum the compiler cannot
 * drop), which checks that data + nbytes lies inside the input; every lookup by name must find
 * the same tensor. On failure the status must be a documented content error with a non-empty
 * message and no handle. Any violated property calls __builtin_trap (reported as a crash).
 *
 * Build and run: make fuzz FUZZ_SECONDS=60 (fuzz/fuzz.mk; corpus from scripts/fuzz_seeds.py). */
#include <stdint.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink;

#define PROPERTY(cond)                                                                        \
    do {                                                                                      \
        if (!(cond)) __builtin_trap();                                                        \
    } while (0)

static void walk(const nib_st_file *f, const uint8_t *data, size_t size) {
    uint64_t sum = 0, covered = 0;
    size_t n = nib_st_count(f);
    PROPERTY(nib_st_file_size(f) == size);
    PROPERTY(8 + nib_st_header_size(f) + nib_st_data_size(f) == size);
    PROPERTY((const uint8_t *)nib_st_data(f) == data + 8 + nib_st_header_size(f));
    for (size_t i = 0; i < n; i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        PROPERTY(t != NULL && t->name != NULL && t->name_len > 0);
        PROPERTY(strlen(t->name) == t->name_len); /* no NUL inside a name */
        PROPERTY(t->ndim >= 0 && t->ndim <= NIB_MAX_DIMS);
        PROPERTY(t->end - t->begin == t->nbytes && t->begin <= t->end);
        PROPERTY(t->end <= nib_st_data_size(f));
        PROPERTY(t->begin == covered); /* exact tiling, file order */
        covered = t->end;
        PROPERTY(t->nbytes == t->numel * nib_dtype_size(t->dtype));
        const uint8_t *p = t->data;
        PROPERTY(p >= data && (uint64_t)(p - data) + t->nbytes <= size);
        for (uint64_t j = 0; j < t->nbytes; j++) sum += p[j];
        const nib_st_tensor *byname = nib_st_find(f, t->name);
        PROPERTY(byname == t);
    }
    PROPERTY(covered == nib_st_data_size(f));
    PROPERTY(nib_st_tensor_at(f, n) == NULL);
    PROPERTY(nib_st_find(f, "") == NULL);
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        PROPERTY(kv && kv->key && kv->value && strlen(kv->key) == kv->key_len);
        PROPERTY(kv->value[kv->value_len] == '\0');
        PROPERTY(nib_st_metadata_find(f, kv->key) != NULL);
        for (size_t j = 0; j < kv->value_len; j++) sum += (uint8_t)kv->value[j];
    }
    PROPERTY(nib_st_metadata_at(f, nib_st_metadata_count(f)) == NULL);
    g_sink += sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nib_st_file *f = (nib_st_file *)&g_sink; /* must be reset to NULL by the reader */
    nib_status st = nib_st_open_memory(data, size, &f);
    if (st == NIB_OK) {
        PROPERTY(f != NULL);
        walk(f, data, size);
        nib_st_close(f);
    } else {
        PROPERTY(f == NULL);
        PROPERTY(st == NIB_ERR_FORMAT || st == NIB_ERR_OVERFLOW || st == NIB_ERR_OUT_OF_MEMORY);
        PROPERTY(nib_last_error()[0] != '\0');
    }
    nib_clear_error();
    return 0;
}
