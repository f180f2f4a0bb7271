/* fuzz_json.c — libFuzzer harness for the strict JSON parser (io/json.c).
 *
 * Parses the input (libFuzzer's exact-size heap copy, not NUL-terminated) and, on success, walks the whole tree through every accessor: type,
 * offset, count, elem, member_at, getn/get for every key (must find a value with that key:
 * duplicates are rejected, so exactly that member's value), bool, string, number_text, double,
 * int64; escapes every string and key with nib_json_escape (full length, then into a short
 * buffer: never split a unit) and re-parses the escaped text, which must decode to the same
 * bytes. Also runs nib_json_utf8_valid and nib_json_escape over the raw input. On failure the
 * status must be NIB_ERR_FORMAT / OVERFLOW / OUT_OF_MEMORY with an "at byte N" offset <= size.
 *
 * Build and run: make fuzz FUZZ_SECONDS=60 (fuzz/fuzz.mk). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink;

#define PROPERTY(cond)                                                                        \
    do {                                                                                      \
        if (!(cond)) __builtin_trap();                                                        \
    } while (0)

/* Escape s, check the escaped form is valid JSON string content that decodes back to s. */
static void check_escape(const char *s, size_t n) {
    size_t full = nib_json_escape(NULL, 0, s, n);
    PROPERTY(full <= 6 * n);
    char *buf = malloc(full + 3);
    PROPERTY(buf != NULL);
    buf[0] = '"';
    size_t w = nib_json_escape(buf + 1, full + 1, s, n);
    PROPERTY(w == full && strlen(buf + 1) == full);
    buf[full + 1] = '"';
    nib_json_doc *d = NULL;
    PROPERTY(nib_json_parse(buf, full + 2, 0, &d) == NIB_OK);
    size_t back_len = 0;
    const char *back = nib_json_string(nib_json_root(d), &back_len);
    PROPERTY(back != NULL);
    if (nib_json_utf8_valid(s, n, NULL)) /* invalid bytes become U+FFFD: no round trip */
        PROPERTY(back_len == n && memcmp(back, s, n) == 0);
    nib_json_free(d);
    /* a short buffer: a prefix of the full text, NUL-terminated, never a split unit */
    char small[13];
    size_t cap = (n % 13) + 1;
    PROPERTY(nib_json_escape(small, cap, s, n) == full);
    PROPERTY(strlen(small) < cap && memcmp(small, buf + 1, strlen(small)) == 0);
    free(buf);
}

static void walk(const nib_json_value *v, size_t size, int depth) {
    PROPERTY(depth <= NIB_JSON_MAX_DEPTH);
    nib_json_type ty = nib_json_type_of(v);
    PROPERTY(ty >= NIB_JSON_NULL && ty <= NIB_JSON_OBJECT);
    PROPERTY(nib_json_type_name(ty) != NULL);
    PROPERTY(nib_json_offset(v) < size);
    size_t n = nib_json_count(v), len = 0;
    int64_t i64;
    switch (ty) {
    case NIB_JSON_NULL: PROPERTY(n == 0); break;
    case NIB_JSON_BOOL: g_sink += nib_json_bool(v); break;
    case NIB_JSON_NUMBER: {
        const char *txt = nib_json_number_text(v, &len);
        PROPERTY(txt && strlen(txt) == len && len > 0);
        double d = nib_json_double(v);
        PROPERTY(isfinite(d));
        if (nib_json_int64(v, &i64) == NIB_OK) {
            g_sink += (uint64_t)i64;
            PROPERTY(!strpbrk(txt, ".eE"));
            /* the exact integer prints back as the same text */
            char b[32];
            snprintf(b, sizeof b, "%lld", (long long)i64);
            PROPERTY(strcmp(b, txt) == 0);
        }
        nib_clear_error();
        break;
    }
    case NIB_JSON_STRING: {
        const char *s = nib_json_string(v, &len);
        PROPERTY(s && s[len] == '\0');
        PROPERTY(nib_json_utf8_valid(s, len, NULL));
        check_escape(s, len);
        break;
    }
    case NIB_JSON_ARRAY:
        for (size_t i = 0; i < n; i++) {
            const nib_json_value *e = nib_json_elem(v, i);
            PROPERTY(e != NULL);
            walk(e, size, depth + 1);
        }
        PROPERTY(nib_json_elem(v, n) == NULL && nib_json_member_at(v, 0) == NULL);
        break;
    case NIB_JSON_OBJECT:
        for (size_t i = 0; i < n; i++) {
            const nib_json_member *m = nib_json_member_at(v, i);
            PROPERTY(m && m->key && m->value && m->key[m->key_len] == '\0');
            PROPERTY(m->key_offset < size);
            PROPERTY(nib_json_utf8_valid(m->key, m->key_len, NULL));
            PROPERTY(nib_json_getn(v, m->key, m->key_len) == m->value);
            if (strlen(m->key) == m->key_len) PROPERTY(nib_json_get(v, m->key) == m->value);
            check_escape(m->key, m->key_len);
            walk(m->value, size, depth + 1);
        }
        PROPERTY(nib_json_member_at(v, n) == NULL && nib_json_elem(v, 0) == NULL);
        break;
    default: PROPERTY(0);
    }
    if (ty != NIB_JSON_STRING) PROPERTY(nib_json_string(v, NULL) == NULL);
    if (ty != NIB_JSON_NUMBER) {
        PROPERTY(nib_json_number_text(v, NULL) == NULL && isnan(nib_json_double(v)));
        PROPERTY(nib_json_int64(v, &i64) == NIB_ERR_FORMAT);
        nib_clear_error();
    }
    if (ty != NIB_JSON_OBJECT) PROPERTY(nib_json_get(v, "a") == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nib_json_doc *doc = (nib_json_doc *)&g_sink; /* must be reset to NULL by the parser */
    nib_status st = nib_json_parse((const char *)data, size, 0, &doc);
    if (st == NIB_OK) {
        PROPERTY(doc != NULL);
        walk(nib_json_root(doc), size, 0);
        nib_json_free(doc);
    } else {
        PROPERTY(doc == NULL);
        PROPERTY(st == NIB_ERR_FORMAT || st == NIB_ERR_OVERFLOW || st == NIB_ERR_OUT_OF_MEMORY);
        const char *msg = nib_last_error();
        PROPERTY(msg[0] != '\0');
        /* the parser's own offset is the last " at byte N" (a key shown earlier may hold one) */
        const char *at = NULL;
        for (const char *p = strstr(msg, " at byte "); p; p = strstr(p + 1, " at byte ")) at = p;
        if (st == NIB_ERR_FORMAT) {
            PROPERTY(at != NULL);
            PROPERTY(strtoull(at + 9, NULL, 10) <= size);
        }
    }
    nib_clear_error();
    /* the raw input through the string helpers */
    size_t bad = 0;
    if (!nib_json_utf8_valid((const char *)data, size, &bad)) PROPERTY(bad < size);
    if (size <= 4096) {
        char out[64];
        size_t full = nib_json_escape(out, sizeof out, (const char *)data, size);
        PROPERTY(full <= 6 * size && strlen(out) < sizeof out);
    }
    return 0;
}
