/* fuzz_config.c — libFuzzer harness for the model-config reader (models/pi05_config.c).
 *
 * The input is either a safetensors file, from which nib_pi05_config_from_file derives the
 * Pi0.5 dimensions (tensor shapes plus the "nib.pi05.config" metadata JSON), or, when it does
 * not open as one, a config JSON for nib_pi05_config_parse_json, and (its first 255 bytes, as a
 * C string) a precision override spec for nib_pi05_precision_override. Properties: no crash or
 * sanitizer report; a failure has a message; a config accepted from a file satisfies the
 * invariants the model code relies on (layers >= 2, expert layers = layers, heads group over
 * the KV heads, SigLIP width = heads x head_dim, 1..64 steps).
 *
 * Build and run: make fuzz FUZZ_SECONDS=60 (fuzz/fuzz.mk; seeds from fuzz/fuzz_seeds.c). */
#include <stdint.h>
#include <string.h>

#include "models/pi05.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PROPERTY(cond)                                                                        \
    do {                                                                                      \
        if (!(cond)) __builtin_trap();                                                        \
    } while (0)

static void check_fail(nib_status st) {
    PROPERTY(st != NIB_OK && st != NIB_ERR_INTERNAL);
    PROPERTY(nib_last_error()[0] != '\0');
    nib_clear_error();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nib_st_file *f = NULL;
    nib_pi05_config c;
    nib_status st = nib_st_open_memory(data, size, &f);
    if (st == NIB_OK) {
        st = nib_pi05_config_from_file(f, &c);
        if (st != NIB_OK) {
            check_fail(st);
        } else {
            PROPERTY(c.layers >= 2 && c.e_layers == c.layers && c.v_layers >= 1);
            PROPERTY(c.kv_heads >= 1 && c.heads % c.kv_heads == 0 && c.e_heads % c.kv_heads == 0);
            PROPERTY(c.v_heads >= 1 && (int64_t)c.v_head_dim * c.v_heads == c.v_width);
            PROPERTY(c.steps >= 1 && c.steps <= 64);
        }
        nib_st_close(f);
        nib_clear_error();
        return 0;
    }
    nib_clear_error();
    memset(&c, 0, sizeof c);
    st = nib_pi05_config_parse_json((const char *)data, size, &c);
    if (st != NIB_OK) check_fail(st);
    char spec[256];
    size_t n = size < sizeof spec - 1 ? size : sizeof spec - 1;
    memcpy(spec, data, n);
    spec[n] = '\0';
    nib_pi05_precision p;
    PROPERTY(nib_pi05_preset("fast", &p) == NIB_OK);
    st = nib_pi05_precision_override(&p, spec);
    if (st != NIB_OK) check_fail(st);
    else {
        char buf[256];
        PROPERTY(nib_pi05_precision_str(&p, buf, sizeof buf) == buf);
    }
    nib_clear_error();
    return 0;
}
