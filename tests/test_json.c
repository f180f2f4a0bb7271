/* test_json.c — the strict JSON parser: a table of valid and invalid documents (every rule in
 * io/json.h), error offsets, accessors, exact integers, escaping. Every document is parsed
 * from an exact-size heap copy, so a read past the end shows up under ASan. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/json.h"

typedef struct json_case {
    const char *text;
    size_t len;      /* 0: strlen(text) */
    int ok;
    long at;         /* expected error offset ("at byte N"); -1: not checked */
    const char *why; /* substring of the message; NULL: not checked */
} json_case;

/* Parse text[0 .. len) from its own heap block of exactly len bytes. */
static nib_status parse_exact(const char *text, size_t len, uint64_t base, nib_json_doc **doc) {
    char *copy = malloc(len ? len : 1);
    if (!copy) return NIB_ERR_OUT_OF_MEMORY;
    if (len) memcpy(copy, text, len);
    nib_status st = nib_json_parse(copy, len, base, doc);
    free(copy); /* the tree must not point into the input */
    return st;
}

static const json_case k_cases[] = {
    /* valid */
    {"{}", 0, 1, -1, NULL},
    {"[]", 0, 1, -1, NULL},
    {"0", 0, 1, -1, NULL},
    {"-0", 0, 1, -1, NULL},
    {"-12.5e-3", 0, 1, -1, NULL},
    {"1E+2", 0, 1, -1, NULL},
    {"1e-400", 0, 1, -1, NULL}, /* underflows to 0: representable, accepted */
    {"\"\"", 0, 1, -1, NULL},
    {" \t\r\n{\"a\":[1,2,{\"b\":null}],\"c\":true,\"d\":false} \n", 0, 1, -1, NULL},
    {"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", 0, 1, -1, NULL},
    {"\"\\u00e9\\uD83D\\uDE00\"", 0, 1, -1, NULL},
    {"\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", 0, 1, -1, NULL}, /* raw 2-, 3-, 4-byte UTF-8 */
    {"\"\xf4\x8f\xbf\xbf\"", 0, 1, -1, NULL},                     /* U+10FFFF, the last */
    {"\"\xef\xbf\xbf\x7f\"", 0, 1, -1, NULL},                     /* U+FFFF, raw DEL */
    {"\"a\\u0000b\"", 0, 1, -1, NULL},
    {"{\"a\":1,\"A\":2,\"a \":3}", 0, 1, -1, NULL},
    /* invalid: structure */
    {"", 0, 0, 0, "empty document"},
    {"  \n ", 0, 0, 4, "empty document"},
    {"[1,2,]", 0, 0, 4, "trailing comma"},
    {"{\"a\":1,}", 0, 0, 6, "trailing comma"},
    {"[1 2]", 0, 0, 3, "expected ',' or ']'"},
    {"{\"a\" 1}", 0, 0, 5, "expected ':'"},
    {"{1:2}", 0, 0, 1, "expected a string key"},
    {"{'a':1}", 0, 0, 1, "expected a string key"},
    {"[1,2", 0, 0, 4, "expected ',' or ']', found end of input"},
    {"{\"a\":1", 0, 0, 6, "found end of input"},
    {"{\"a\":", 0, 0, 5, "expected a value"},
    {"\"abc", 0, 0, 0, "unterminated string"},
    {"{} x", 0, 0, 3, "after the top-level value"},
    {"{}{}", 0, 0, 2, "after the top-level value"},
    {"{}\0", 3, 0, 2, "after the top-level value"},
    {"// c\n{}", 0, 0, 0, "expected a value"},
    {"{} /* c */", 0, 0, 3, "after the top-level value"},
    {"\xef\xbb\xbf{}", 0, 0, 0, "expected a value"}, /* BOM */
    {"\f{}", 0, 0, 0, "expected a value"},            /* form feed is not JSON whitespace */
    {"\xc3\xa9", 0, 0, 0, "expected a value"},        /* UTF-8 outside a string */
    /* invalid: duplicate keys, compared after unescaping */
    {"{\"a\":1,\"a\":2}", 0, 0, 7, "duplicate key \"a\" (first at byte 1)"},
    {"{\"b\":1,\"a\":{\"x\":1},\"b\":3}", 0, 0, 19, "duplicate key \"b\""},
    {"{\"a\":1,\"\\u0061\":2}", 0, 0, 7, "duplicate key"},
    {"[{\"k\":1},{\"k\":2,\"k\":3}]", 0, 0, 16, "duplicate key \"k\""},
    /* invalid: literals and numbers */
    {"NaN", 0, 0, 0, "expected a value"},
    {"Infinity", 0, 0, 0, "expected a value"},
    {"-Infinity", 0, 0, 1, "expected a digit after '-'"},
    {"tru", 0, 0, 0, "invalid literal"},
    {"True", 0, 0, 0, "expected a value"},
    {"nul", 0, 0, 0, "invalid literal"},
    {"01", 0, 0, 0, "leading zero"},
    {"-01", 0, 0, 0, "leading zero"},
    {"-", 0, 0, 1, "expected a digit after '-'"},
    {"1.", 0, 0, 2, "expected a digit after '.'"},
    {"1.e3", 0, 0, 2, "expected a digit after '.'"},
    {".5", 0, 0, 0, "expected a value"},
    {"+1", 0, 0, 0, "expected a value"},
    {"1e", 0, 0, 2, "expected a digit in exponent"},
    {"1e+", 0, 0, 3, "expected a digit in exponent"},
    {"0x10", 0, 0, 1, "after the top-level value"},
    {"1e400", 0, 0, 0, "out of the range of a double"},
    {"[-1e999]", 0, 0, 1, "out of the range of a double"},
    /* invalid: strings */
    {"\"a\x01\"", 0, 0, 2, "raw control character 0x01"},
    {"\"\t\"", 0, 0, 1, "raw control character 0x09"},
    {"\"\\q\"", 0, 0, 1, "invalid escape"},
    {"\"\\", 0, 0, 1, "unterminated escape"},
    {"\"\\u12xy\"", 0, 0, 5, "invalid hex digit 'x'"},
    {"\"\\u12", 0, 0, 1, "truncated \\u escape"},
    {"\"\\uZZZZ\"", 0, 0, 3, "invalid hex digit"},
    {"\"\\ud800\"", 0, 0, 1, "lone high surrogate"},
    {"\"\\uDBFFx\"", 0, 0, 1, "lone high surrogate"},
    {"\"\\udc00\"", 0, 0, 1, "lone low surrogate"},
    {"\"\\ud800\\u0041\"", 0, 0, 7, "not a low surrogate"},
    {"\"\\ud800\\ud800\"", 0, 0, 7, "not a low surrogate"},
    /* invalid: UTF-8 */
    {"\"\xc0\xaf\"", 0, 0, 1, "overlong"},
    {"\"\xc1\xbf\"", 0, 0, 1, "overlong"},
    {"\"\xe0\x80\xaf\"", 0, 0, 1, "overlong"},
    {"\"\xf0\x80\x80\xaf\"", 0, 0, 1, "overlong"},
    {"\"\xed\xa0\x80\"", 0, 0, 1, "surrogate"},   /* U+D800 encoded directly */
    {"\"\xed\xbf\xbf\"", 0, 0, 1, "surrogate"},   /* U+DFFF */
    {"\"\xf4\x90\x80\x80\"", 0, 0, 1, "above U+10FFFF"},
    {"\"\xf5\x80\x80\x80\"", 0, 0, 1, "above U+10FFFF"},
    {"\"\xff\"", 0, 0, 1, "above U+10FFFF"},
    {"\"ab\x80\"", 0, 0, 3, "unexpected continuation byte"},
    {"\"\xc3\"", 0, 0, 1, "truncated sequence"},
    {"\"\xe2\x82\"", 0, 0, 1, "truncated sequence"},
    {"\"\xf0\x9f\x98\"", 0, 0, 1, "truncated sequence"},
    {"\"\xe2\x82", 0, 0, 1, "truncated sequence"}, /* at the very end of the input */
};

NIB_TEST(json_table) {
    int n_ok = 0, n_bad = 0;
    for (size_t i = 0; i < NIB_ARRAY_LEN(k_cases); i++) {
        const json_case *c = &k_cases[i];
        size_t len = c->len ? c->len : strlen(c->text);
        nib_json_doc *doc = NULL;
        nib_status st = parse_exact(c->text, len, 0, &doc);
        const char *msg = nib_last_error();
        if (c->ok) {
            n_ok++;
            CHECK_MSG(st == NIB_OK, "case %zu should parse: %s", i, msg);
            CHECK_MSG(nib_json_root(doc) != NULL, "case %zu has no root", i);
        } else {
            n_bad++;
            CHECK_MSG(st == NIB_ERR_FORMAT, "case %zu: got %s, want NIB_ERR_FORMAT", i,
                      nib_status_name(st));
            CHECK_MSG(doc == NULL, "case %zu: failed parse returned a doc", i);
            CHECK_MSG(strstr(msg, "json: ") && strstr(msg, " at byte "), "case %zu: '%s'", i, msg);
            if (c->why) CHECK_MSG(strstr(msg, c->why), "case %zu: '%s' lacks '%s'", i, msg, c->why);
            if (c->at >= 0) {
                char want[48];
                snprintf(want, sizeof want, " at byte %ld", c->at);
                CHECK_MSG(strstr(msg, want), "case %zu: '%s' lacks '%s'", i, msg, want);
            }
        }
        nib_json_free(doc);
    }
    CHECK(n_ok >= 15 && n_bad >= 60);
}

/* "[[[...]]]" nested `depth` deep, in a heap block of exactly that size. */
static nib_status parse_nested(int depth, uint64_t base) {
    char text[2 * 70];
    for (int i = 0; i < depth; i++) {
        text[i] = '[';
        text[2 * depth - 1 - i] = ']';
    }
    nib_json_doc *doc = NULL;
    nib_status st = parse_exact(text, 2 * (size_t)depth, base, &doc);
    nib_json_free(doc);
    return st;
}

NIB_TEST(json_depth_limit) {
    CHECK(NIB_JSON_MAX_DEPTH == 64);
    CHECK_OK(parse_nested(64, 0));
    CHECK_ST(parse_nested(65, 0), NIB_ERR_FORMAT);
    /* the 65th '[' is at index 64 */
    CHECK_MSG(strstr(nib_last_error(), "nesting deeper than 64 levels at byte 64"), "%s",
              nib_last_error());
    /* objects count too: 64 levels of {"a": ...} around a 0 */
    char buf[64 * 6 + 2];
    size_t w = 0;
    for (int d = 0; d < 65; d++) {
        nib_json_doc *doc = NULL;
        w = 0;
        for (int i = 0; i < d; i++) w += (size_t)snprintf(buf + w, sizeof buf - w, "{\"a\":");
        buf[w++] = '0';
        for (int i = 0; i < d; i++) buf[w++] = '}';
        nib_status st = parse_exact(buf, w, 0, &doc);
        CHECK_MSG(d <= 64 ? st == NIB_OK : st == NIB_ERR_FORMAT, "depth %d -> %s", d,
                  nib_status_name(st));
        nib_json_free(doc);
    }
}

NIB_TEST(json_base_offset_in_messages) {
    nib_json_doc *doc = NULL;
    CHECK_ST(parse_exact("[1,]", 4, 1000, &doc), NIB_ERR_FORMAT);
    CHECK_MSG(strstr(nib_last_error(), "at byte 1002"), "%s", nib_last_error());
    CHECK_OK(parse_exact(" {\"k\": [7]}", 11, 8, &doc));
    const nib_json_value *root = nib_json_root(doc);
    CHECK(nib_json_offset(root) == 9);
    CHECK(nib_json_member_at(root, 0)->key_offset == 10);
    CHECK(nib_json_offset(nib_json_get(root, "k")) == 15);
    CHECK(nib_json_offset(nib_json_elem(nib_json_get(root, "k"), 0)) == 16);
    nib_json_free(doc);
}

NIB_TEST(json_not_nul_terminated) {
    /* only len bytes are read: "[1]" followed by garbage that is not part of the input */
    nib_json_doc *doc = NULL;
    CHECK_OK(nib_json_parse("[1]xyz", 3, 0, &doc));
    CHECK(nib_json_count(nib_json_root(doc)) == 1);
    nib_json_free(doc);
    CHECK_ST(nib_json_parse("[1]xyz", 4, 0, &doc), NIB_ERR_FORMAT);
    CHECK_ST(nib_json_parse(NULL, 1, 0, &doc), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_json_parse("{}", 2, 0, NULL), NIB_ERR_INVALID_ARG);
    CHECK_ST(nib_json_parse(NULL, 0, 0, &doc), NIB_ERR_FORMAT); /* empty document */
    nib_json_free(NULL);
}

NIB_TEST(json_accessors) {
    const char *text = "{\"name\":\"w\\u0000x\",\"dims\":[2,3,5],\"f\":1.5,\"t\":true,\"n\":null,"
                       "\"o\":{\"z\":1,\"a\":2},\"e\":[]}";
    nib_json_doc *doc = NULL;
    CHECK_OK(parse_exact(text, strlen(text), 0, &doc));
    const nib_json_value *r = nib_json_root(doc);
    REQUIRE(nib_json_type_of(r) == NIB_JSON_OBJECT);
    CHECK(nib_json_count(r) == 7);
    /* members in document order */
    const char *order[] = {"name", "dims", "f", "t", "n", "o", "e"};
    for (size_t i = 0; i < 7; i++) CHECK(strcmp(nib_json_member_at(r, i)->key, order[i]) == 0);
    CHECK(nib_json_member_at(r, 7) == NULL);
    size_t n = 0;
    const char *s = nib_json_string(nib_json_get(r, "name"), &n);
    CHECK(s && n == 3 && memcmp(s, "w\0x", 3) == 0 && s[3] == '\0');
    const nib_json_value *dims = nib_json_get(r, "dims");
    CHECK(nib_json_type_of(dims) == NIB_JSON_ARRAY && nib_json_count(dims) == 3);
    int64_t x = 0;
    CHECK_OK(nib_json_int64(nib_json_elem(dims, 2), &x));
    CHECK(x == 5);
    CHECK(nib_json_elem(dims, 3) == NULL);
    CHECK(nib_json_double(nib_json_get(r, "f")) == 1.5);
    CHECK(strcmp(nib_json_number_text(nib_json_get(r, "f"), &n), "1.5") == 0 && n == 3);
    CHECK(nib_json_bool(nib_json_get(r, "t")));
    CHECK(!nib_json_bool(nib_json_get(r, "n")));
    CHECK(nib_json_type_of(nib_json_get(r, "n")) == NIB_JSON_NULL);
    CHECK(nib_json_get(nib_json_get(r, "o"), "a") != NULL);
    CHECK(nib_json_getn(r, "namex", 4) == nib_json_get(r, "name"));
    CHECK(nib_json_count(nib_json_get(r, "e")) == 0);
    /* absent values chain safely */
    CHECK(nib_json_get(r, "missing") == NULL);
    CHECK(nib_json_type_of(nib_json_get(nib_json_get(r, "missing"), "x")) == NIB_JSON_NONE);
    CHECK(nib_json_string(nib_json_get(r, "f"), NULL) == NULL);
    CHECK(isnan(nib_json_double(nib_json_get(r, "name"))));
    CHECK(strcmp(nib_json_type_name(NIB_JSON_OBJECT), "object") == 0);
    CHECK_ST(nib_json_int64(nib_json_get(r, "missing"), &x), NIB_ERR_FORMAT);
    CHECK_ST(nib_json_int64(nib_json_get(r, "name"), &x), NIB_ERR_FORMAT);
    nib_json_free(doc);
}

NIB_TEST(json_int64_exact) {
    static const struct {
        const char *text;
        int ok;
        int64_t want;
    } cases[] = {
        {"0", 1, 0},
        {"7", 1, 7},
        {"-5", 1, -5},
        {"9223372036854775807", 1, INT64_MAX},
        {"-9223372036854775808", 1, INT64_MIN},
        {"9223372036854775808", 0, 0},
        {"-9223372036854775809", 0, 0},
        {"18446744073709551616", 0, 0},
        {"1.0", 0, 0},
        {"1e3", 0, 0},
        {"1E3", 0, 0},
        {"-0", 0, 0},
        {"0.5", 0, 0},
    };
    for (size_t i = 0; i < NIB_ARRAY_LEN(cases); i++) {
        nib_json_doc *doc = NULL;
        char text[64];
        int len = snprintf(text, sizeof text, "[%s]", cases[i].text);
        CHECK_OK(parse_exact(text, (size_t)len, 0, &doc));
        int64_t x = 42;
        nib_status st = nib_json_int64(nib_json_elem(nib_json_root(doc), 0), &x);
        if (cases[i].ok) {
            CHECK_MSG(st == NIB_OK && x == cases[i].want, "%s -> %s %lld", cases[i].text,
                      nib_status_name(st), (long long)x);
        } else {
            CHECK_MSG(st == NIB_ERR_FORMAT, "%s accepted as %lld", cases[i].text, (long long)x);
            CHECK_MSG(strstr(nib_last_error(), "at byte 1"), "%s", nib_last_error());
        }
        nib_json_free(doc);
    }
}

NIB_TEST(json_escape_and_reparse) {
    char out[64];
    /* snprintf-style: full length returned, only whole units written */
    CHECK(nib_json_escape(out, sizeof out, "a\"b\\c\n\x01", 7) == 15);
    CHECK(strcmp(out, "a\\\"b\\\\c\\n\\u0001") == 0);
    CHECK(nib_json_escape(out, 4, "ab\"c", 4) == 5);
    CHECK(strcmp(out, "ab") == 0);
    CHECK(nib_json_escape(NULL, 0, "abc", 3) == 3);
    /* DEL and C1 controls are escaped; other UTF-8 passes through; bad bytes become U+FFFD */
    CHECK(nib_json_escape(out, sizeof out, "\x7f\xc2\x85\xc3\xa9\xff", 6) == 20);
    CHECK(strcmp(out, "\\u007f\\u0085\xc3\xa9\\ufffd") == 0);
    /* escape(random valid UTF-8) parses back to the same bytes */
    nib_rng r;
    nib_test_rng(t, &r);
    static const uint32_t pool[] = {0x0, 0x1, 0x1f, '"', '\\', '/', 'a', 0x7f, 0x85, 0xe9,
                                    0x7ff, 0x800, 0x20ac, 0xfffd, 0xffff, 0x10000, 0x1f600,
                                    0x10ffff};
    for (int it = 0; it < 200; it++) {
        char src[200], esc[200 * 6 + 3];
        size_t n = 0, cnt = nib_rng_below(&r, 30);
        for (size_t k = 0; k < cnt; k++) {
            uint32_t cp = pool[nib_rng_below(&r, NIB_ARRAY_LEN(pool))];
            /* same encoder rules as the parser: write it by hand here */
            if (cp < 0x80) src[n++] = (char)cp;
            else if (cp < 0x800) {
                src[n++] = (char)(0xC0 | cp >> 6);
                src[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                src[n++] = (char)(0xE0 | cp >> 12);
                src[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                src[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                src[n++] = (char)(0xF0 | cp >> 18);
                src[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                src[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                src[n++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        CHECK(nib_json_utf8_valid(src, n, NULL));
        esc[0] = '"';
        size_t e = nib_json_escape(esc + 1, sizeof esc - 2, src, n);
        REQUIRE(e + 2 < sizeof esc);
        esc[e + 1] = '"';
        for (size_t k = 0; k < e; k++) CHECK((unsigned char)esc[1 + k] >= 0x20);
        nib_json_doc *doc = NULL;
        CHECK_OK(parse_exact(esc, e + 2, 0, &doc));
        size_t got_n = 0;
        const char *got = nib_json_string(nib_json_root(doc), &got_n);
        CHECK_MSG(got && got_n == n && memcmp(got, src, n) == 0, "iteration %d", it);
        nib_json_free(doc);
    }
    size_t bad = 0;
    CHECK(!nib_json_utf8_valid("ab\xed\xa0\x80", 5, &bad) && bad == 2);
    CHECK(!nib_json_utf8_valid("\xc3", 1, &bad) && bad == 0);
}

NIB_TEST(json_large_object_duplicate_check_is_fast) {
    /* 200k distinct keys then one duplicate at the end: the sort-based check finds it and
     * stays O(n log n) (a pairwise scan would take minutes). */
    const size_t n = 200000;
    size_t cap = n * 24 + 64, w = 0;
    char *text = malloc(cap);
    REQUIRE(text);
    text[w++] = '{';
    for (size_t i = 0; i < n; i++)
        w += (size_t)snprintf(text + w, cap - w, "%s\"k%zu\":%zu", i ? "," : "", i, i);
    size_t body = w; /* the members, without the closing brace */
    nib_json_doc *doc = NULL;
    double t0 = nib_now_s();
    text[body] = '}';
    CHECK_OK(parse_exact(text, body + 1, 0, &doc));
    CHECK(nib_json_count(nib_json_root(doc)) == n);
    int64_t x = 0;
    CHECK_OK(nib_json_int64(nib_json_get(nib_json_root(doc), "k199999"), &x));
    CHECK(x == 199999);
    nib_json_free(doc);
    doc = NULL;
    size_t dup_at = body + 1; /* the opening quote of the repeated key */
    w = body + (size_t)snprintf(text + body, cap - body, ",\"k123\":0}");
    CHECK_ST(parse_exact(text, w, 0, &doc), NIB_ERR_FORMAT);
    CHECK(doc == NULL);
    char want[64];
    snprintf(want, sizeof want, "duplicate key \"k123\" (first at byte");
    CHECK_MSG(strstr(nib_last_error(), want), "%s", nib_last_error());
    snprintf(want, sizeof want, "at byte %zu", dup_at);
    CHECK_MSG(strstr(nib_last_error(), want), "%s", nib_last_error());
    double dt = nib_now_s() - t0;
    CHECK_MSG(dt < 20.0, "parsing 2 x 200k keys took %.1f s", dt);
    free(text);
}
