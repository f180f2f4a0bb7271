/* json.c — strict RFC 8259 parser (recursive descent, depth-bounded) into an arena tree.
 *
 * Parsing is one pass. A container's children are collected on a scratch stack while it is
 * open and copied into one contiguous arena block when it closes, so element access is O(1).
 * Objects also get an index of member pointers sorted by key: it finds duplicate keys in
 * O(n log n) (a quadratic scan would let a large header stall the loader) and makes lookup
 * O(log n). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

/* ---- tree -------------------------------------------------------------------------------- */

struct nib_json_value {
    nib_json_type type;
    uint64_t offset; /* base_offset + index of the first byte */
    size_t n;        /* string: byte length; number: text length; array/object: count */
    union {
        bool b;
        const char *str; /* decoded, NUL-terminated */
        struct {
            const char *text; /* NUL-terminated, exactly as written (for exact integers) */
            double d;         /* nearest double, finite */
        } num;
        const nib_json_value *items; /* array: n values */
        struct {
            const nib_json_member *members;       /* n, document order */
            const nib_json_member *const *sorted; /* n, by (key, key_offset) */
        } obj;
    } u;
};

/* Arena: a list of chunks; allocations are never freed individually. */
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    _Alignas(max_align_t) unsigned char data[];
} arena_chunk;

#define ARENA_CHUNK_BYTES ((size_t)64 * 1024)

struct nib_json_doc {
    arena_chunk *chunks; /* the current chunk first */
    nib_json_value root;
};

static arena_chunk *new_chunk(size_t cap) {
    size_t total;
    if (nib_add_overflow_size(sizeof(arena_chunk), cap, &total)) {
        NIB_ERR(NIB_ERR_OVERFLOW, "json: arena chunk of %zu bytes overflows", cap);
        return NULL;
    }
    arena_chunk *c = nib_malloc(total);
    if (c) {
        c->cap = cap;
        c->used = 0;
        c->next = NULL;
    }
    return c;
}

/* n bytes aligned to `align` (a power of two, at most _Alignof(max_align_t)). A large block
 * gets a chunk of its own behind the current one, so the current one's free space is kept. */
static void *arena_alloc(nib_json_doc *d, size_t n, size_t align) {
    arena_chunk *c = d->chunks;
    if (n > ARENA_CHUNK_BYTES / 4) {
        arena_chunk *big = new_chunk(n);
        if (!big) return NULL;
        big->used = n;
        big->next = c ? c->next : NULL;
        if (c) c->next = big;
        else d->chunks = big;
        return big->data;
    }
    size_t pad = c ? (align - c->used % align) % align : 0;
    if (!c || c->cap - c->used < pad + n) { /* pad + n <= 16 KiB + 16: no overflow */
        c = new_chunk(ARENA_CHUNK_BYTES);
        if (!c) return NULL;
        c->next = d->chunks;
        d->chunks = c;
        pad = 0;
    }
    void *p = c->data + c->used + pad;
    c->used += pad + n;
    return p;
}

/* ---- parser state -------------------------------------------------------------------------- */

/* A child of the innermost open container (key unused for arrays). */
typedef struct slot {
    const char *key;
    size_t key_len;
    uint64_t key_offset;
    nib_json_value value;
} slot;

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    uint64_t base;
    int depth;
    nib_json_doc *doc;
    slot *stack; /* children of every open container, innermost last */
    size_t top, cap;
    char *sbuf;  /* decoded bytes of the string being parsed */
    size_t slen, scap;
} parser;

/* Set a NIB_ERR_FORMAT "json: <what> at byte N" message; `at` is an index into the input. */
static nib_status json_fail(const parser *ps, size_t at, int line, const char *fmt, ...)
    NIB_PRINTF(4, 5);
static nib_status json_fail(const parser *ps, size_t at, int line, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return nib_set_error(NIB_ERR_FORMAT, __FILE__, line, "json: %s at byte %llu", what,
                         (unsigned long long)(ps->base + at));
}
#define FAIL(ps, at, ...) json_fail((ps), (at), __LINE__, __VA_ARGS__)

/* "'x'" for printable ASCII, "byte 0xNN" otherwise: never echo raw control bytes. */
static const char *show_byte(unsigned char c, char buf[16]) {
    if (c > 0x20 && c < 0x7F) snprintf(buf, 16, "'%c'", c);
    else snprintf(buf, 16, "byte 0x%02X", c);
    return buf;
}

/* The byte at pos for a message, or "end of input". */
static const char *show_here(const parser *ps, char buf[16]) {
    if (ps->pos >= ps->len) return "end of input";
    return show_byte(ps->s[ps->pos], buf);
}

/* Escaped, truncated copy of a string for messages. */
static const char *show_str(const char *s, size_t n, char *buf, size_t cap) {
    size_t full = nib_json_escape(buf, cap - 4, s, n);
    if (full >= cap - 4) strcat(buf, "...");
    return buf;
}

static void skip_ws(parser *ps) {
    while (ps->pos < ps->len) {
        unsigned char c = ps->s[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        ps->pos++;
    }
}

static nib_status push_slot(parser *ps, const slot *sl) {
    if (ps->top == ps->cap) {
        size_t ncap = ps->cap ? ps->cap * 2 : 64, bytes;
        if (nib_mul_overflow_size(ncap, sizeof(slot), &bytes))
            return NIB_ERR(NIB_ERR_OVERFLOW, "json: %zu open values overflow", ncap);
        slot *ns = nib_realloc(ps->stack, bytes);
        if (!ns) return NIB_ERR_OUT_OF_MEMORY;
        ps->stack = ns;
        ps->cap = ncap;
    }
    ps->stack[ps->top++] = *sl;
    return NIB_OK;
}

static nib_status sbuf_put(parser *ps, const void *p, size_t n) {
    if (n == 0) return NIB_OK;
    if (ps->scap - ps->slen < n) {
        size_t ncap = ps->scap ? ps->scap : 256;
        while (ncap - ps->slen < n) {
            if (nib_mul_overflow_size(ncap, 2, &ncap))
                return NIB_ERR(NIB_ERR_OVERFLOW, "json: string buffer overflows");
        }
        char *nb = nib_realloc(ps->sbuf, ncap);
        if (!nb) return NIB_ERR_OUT_OF_MEMORY;
        ps->sbuf = nb;
        ps->scap = ncap;
    }
    memcpy(ps->sbuf + ps->slen, p, n);
    ps->slen += n;
    return NIB_OK;
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Length (1..4) of the valid UTF-8 sequence at s, or 0 with *why saying what is wrong.
 * Table 3-7 of the Unicode standard: the second byte's range depends on the lead byte. */
static size_t utf8_seq(const unsigned char *s, size_t avail, const char **why) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC0) {
        *why = "unexpected continuation byte";
        return 0;
    }
    if (c < 0xC2) {
        *why = "overlong encoding";
        return 0;
    }
    if (c < 0xE0) need = 2;
    else if (c < 0xF0) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      /* below: overlong */
        else if (c == 0xED) hi = 0x9F; /* above: UTF-16 surrogates D800..DFFF */
    } else if (c < 0xF5) {
        need = 4;
        if (c == 0xF0) lo = 0x90;      /* below: overlong */
        else if (c == 0xF4) hi = 0x8F; /* above: > U+10FFFF */
    } else {
        *why = "byte 0xF5..0xFF, never in UTF-8: above U+10FFFF";
        return 0;
    }
    if (avail < 2 || s[1] < lo || s[1] > hi) {
        if (avail >= 2 && s[1] >= 0x80 && s[1] <= 0xBF)
            *why = c == 0xED   ? "encoded UTF-16 surrogate"
                   : c == 0xF4 ? "code point above U+10FFFF"
                               : "overlong encoding";
        else *why = "truncated sequence";
        return 0;
    }
    for (size_t i = 2; i < need; i++) {
        if (i >= avail || s[i] < 0x80 || s[i] > 0xBF) {
            *why = "truncated sequence";
            return 0;
        }
    }
    return need;
}

bool nib_json_utf8_valid(const char *s, size_t n, size_t *bad_at) {
    const unsigned char *u = (const unsigned char *)s;
    const char *why;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i, &why);
        if (k == 0) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += k;
    }
    return true;
}

static size_t utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- strings ----------------------------------------------------------------------------- */

/* The 4 hex digits of a \u escape at ps->pos (just after "\u"). */
static nib_status read_hex4(parser *ps, size_t esc_at, uint32_t *out) {
    uint32_t v = 0;
    if (ps->len - ps->pos < 4) return FAIL(ps, esc_at, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        unsigned char c = ps->s[ps->pos + (size_t)i];
        uint32_t d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10u;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10u;
        else {
            char b[16];
            return FAIL(ps, ps->pos + (size_t)i, "invalid hex digit %s in \\u escape",
                        show_byte(c, b));
        }
        v = v << 4 | d;
    }
    ps->pos += 4;
    *out = v;
    return NIB_OK;
}

/* \uXXXX, with a UTF-16 surrogate pair combined into one code point. ps->pos is at 'u'. */
static nib_status parse_u_escape(parser *ps, size_t esc_at) {
    uint32_t cp, lo;
    ps->pos++;
    NIB_RETURN_IF_ERR(read_hex4(ps, esc_at, &cp));
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return FAIL(ps, esc_at, "lone low surrogate \\u%04X", (unsigned)cp);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        size_t lo_at = ps->pos;
        if (ps->len - ps->pos < 2 || ps->s[ps->pos] != '\\' || ps->s[ps->pos + 1] != 'u')
            return FAIL(ps, esc_at, "lone high surrogate \\u%04X (no \\u low surrogate follows)",
                        (unsigned)cp);
        ps->pos += 2;
        NIB_RETURN_IF_ERR(read_hex4(ps, lo_at, &lo));
        if (lo < 0xDC00 || lo > 0xDFFF)
            return FAIL(ps, lo_at,
                        "high surrogate \\u%04X followed by \\u%04X, not a low surrogate",
                        (unsigned)cp, (unsigned)lo);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    char enc[4];
    return sbuf_put(ps, enc, utf8_encode(cp, enc));
}

/* One escape; ps->pos is at the backslash. */
static nib_status parse_escape(parser *ps) {
    size_t at = ps->pos;
    if (ps->len - ps->pos < 2) return FAIL(ps, at, "unterminated escape");
    unsigned char c = ps->s[ps->pos + 1];
    char out;
    switch (c) {
    case '"': out = '"'; break;
    case '\\': out = '\\'; break;
    case '/': out = '/'; break;
    case 'b': out = '\b'; break;
    case 'f': out = '\f'; break;
    case 'n': out = '\n'; break;
    case 'r': out = '\r'; break;
    case 't': out = '\t'; break;
    case 'u': ps->pos++; return parse_u_escape(ps, at);
    default: {
        char b[16];
        return FAIL(ps, at, "invalid escape \\ followed by %s", show_byte(c, b));
    }
    }
    ps->pos += 2;
    return sbuf_put(ps, &out, 1);
}

/* A string at ps->pos (the opening quote), decoded into the arena. */
static nib_status parse_string(parser *ps, const char **out, size_t *out_len) {
    size_t start = ps->pos++;
    ps->slen = 0;
    for (;;) {
        /* copy a run of plain printable bytes at once */
        size_t run = ps->pos;
        while (run < ps->len && ps->s[run] >= 0x20 && ps->s[run] < 0x80 && ps->s[run] != '"' &&
               ps->s[run] != '\\')
            run++;
        NIB_RETURN_IF_ERR(sbuf_put(ps, ps->s + ps->pos, run - ps->pos));
        ps->pos = run;
        if (ps->pos >= ps->len) return FAIL(ps, start, "unterminated string");
        unsigned char c = ps->s[ps->pos];
        if (c == '"') break;
        if (c == '\\') {
            NIB_RETURN_IF_ERR(parse_escape(ps));
        } else if (c < 0x20) {
            return FAIL(ps, ps->pos, "raw control character 0x%02X in string (must be escaped)",
                        c);
        } else {
            const char *why = "";
            size_t k = utf8_seq(ps->s + ps->pos, ps->len - ps->pos, &why);
            if (k == 0) return FAIL(ps, ps->pos, "invalid UTF-8 in string (%s)", why);
            NIB_RETURN_IF_ERR(sbuf_put(ps, ps->s + ps->pos, k));
            ps->pos += k;
        }
    }
    ps->pos++; /* closing quote */
    size_t bytes;
    if (nib_add_overflow_size(ps->slen, 1, &bytes))
        return NIB_ERR(NIB_ERR_OVERFLOW, "json: string length overflows");
    char *s = arena_alloc(ps->doc, bytes, 1);
    if (!s) return NIB_ERR_OUT_OF_MEMORY;
    if (ps->slen) memcpy(s, ps->sbuf, ps->slen);
    s[ps->slen] = '\0';
    *out = s;
    *out_len = ps->slen;
    return NIB_OK;
}

/* ---- numbers and literals ------------------------------------------------------------------ */

static bool is_digit(const parser *ps, size_t i) {
    return i < ps->len && ps->s[i] >= '0' && ps->s[i] <= '9';
}

/* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static nib_status parse_number(parser *ps, nib_json_value *v) {
    size_t start = ps->pos;
    if (ps->s[ps->pos] == '-') ps->pos++;
    if (!is_digit(ps, ps->pos)) return FAIL(ps, ps->pos, "expected a digit after '-'");
    if (ps->s[ps->pos] == '0') {
        ps->pos++;
        if (is_digit(ps, ps->pos)) return FAIL(ps, start, "number with a leading zero");
    }
    while (is_digit(ps, ps->pos)) ps->pos++;
    if (ps->pos < ps->len && ps->s[ps->pos] == '.') {
        ps->pos++;
        if (!is_digit(ps, ps->pos)) return FAIL(ps, ps->pos, "expected a digit after '.'");
        while (is_digit(ps, ps->pos)) ps->pos++;
    }
    if (ps->pos < ps->len && (ps->s[ps->pos] == 'e' || ps->s[ps->pos] == 'E')) {
        ps->pos++;
        if (ps->pos < ps->len && (ps->s[ps->pos] == '+' || ps->s[ps->pos] == '-')) ps->pos++;
        if (!is_digit(ps, ps->pos)) return FAIL(ps, ps->pos, "expected a digit in exponent");
        while (is_digit(ps, ps->pos)) ps->pos++;
    }
    size_t n = ps->pos - start, bytes;
    if (nib_add_overflow_size(n, 1, &bytes))
        return NIB_ERR(NIB_ERR_OVERFLOW, "json: number text overflows");
    char *text = arena_alloc(ps->doc, bytes, 1);
    if (!text) return NIB_ERR_OUT_OF_MEMORY;
    memcpy(text, ps->s + start, n);
    text[n] = '\0';
    /* strtod reads the C-locale grammar, a superset of JSON's; nib never calls setlocale */
    double d = strtod(text, NULL);
    if (isinf(d))
        return FAIL(ps, start, "number %.40s%s is out of the range of a double", text,
                    n > 40 ? "..." : "");
    v->type = NIB_JSON_NUMBER;
    v->n = n;
    v->u.num.text = text;
    v->u.num.d = d;
    return NIB_OK;
}

static nib_status parse_literal(parser *ps, nib_json_value *v) {
    static const struct {
        const char *text;
        nib_json_type type;
        bool b;
    } lits[] = {{"true", NIB_JSON_BOOL, true}, {"false", NIB_JSON_BOOL, false},
                {"null", NIB_JSON_NULL, false}};
    for (size_t i = 0; i < NIB_ARRAY_LEN(lits); i++) {
        if (lits[i].text[0] != (char)ps->s[ps->pos]) continue;
        size_t n = strlen(lits[i].text);
        if (ps->len - ps->pos < n || memcmp(ps->s + ps->pos, lits[i].text, n) != 0)
            return FAIL(ps, ps->pos, "invalid literal (expected '%s')", lits[i].text);
        ps->pos += n;
        v->type = lits[i].type;
        v->u.b = lits[i].b;
        return NIB_OK;
    }
    char b[16];
    return FAIL(ps, ps->pos, "expected a value, found %s", show_here(ps, b));
}

/* ---- containers ---------------------------------------------------------------------------- */

static nib_status parse_value(parser *ps, nib_json_value *v);

static nib_status enter(parser *ps) {
    if (ps->depth >= NIB_JSON_MAX_DEPTH)
        return FAIL(ps, ps->pos, "nesting deeper than %d levels", NIB_JSON_MAX_DEPTH);
    ps->depth++;
    ps->pos++; /* the opening bracket */
    return NIB_OK;
}

/* After an element: ',' (not followed by the closer) or the closer. *done = closer seen. */
static nib_status after_element(parser *ps, char closer, bool *done) {
    char b[16];
    skip_ws(ps);
    if (ps->pos < ps->len && ps->s[ps->pos] == (unsigned char)closer) {
        ps->pos++;
        *done = true;
        return NIB_OK;
    }
    if (ps->pos >= ps->len || ps->s[ps->pos] != ',')
        return FAIL(ps, ps->pos, "expected ',' or '%c', found %s", closer, show_here(ps, b));
    size_t comma = ps->pos++;
    skip_ws(ps);
    if (ps->pos < ps->len && ps->s[ps->pos] == (unsigned char)closer)
        return FAIL(ps, comma, "trailing comma before '%c'", closer);
    *done = false;
    return NIB_OK;
}

static nib_status parse_array(parser *ps, nib_json_value *v) {
    NIB_RETURN_IF_ERR(enter(ps));
    size_t mark = ps->top;
    bool done = false;
    skip_ws(ps);
    if (ps->pos < ps->len && ps->s[ps->pos] == ']') {
        ps->pos++;
        done = true;
    }
    while (!done) {
        slot sl = {0};
        NIB_RETURN_IF_ERR(parse_value(ps, &sl.value));
        NIB_RETURN_IF_ERR(push_slot(ps, &sl));
        NIB_RETURN_IF_ERR(after_element(ps, ']', &done));
    }
    size_t n = ps->top - mark, bytes;
    nib_json_value *items = NULL;
    if (n) {
        if (nib_mul_overflow_size(n, sizeof *items, &bytes))
            return NIB_ERR(NIB_ERR_OVERFLOW, "json: array of %zu values overflows", n);
        items = arena_alloc(ps->doc, bytes, _Alignof(nib_json_value));
        if (!items) return NIB_ERR_OUT_OF_MEMORY;
        for (size_t i = 0; i < n; i++) items[i] = ps->stack[mark + i].value;
    }
    ps->top = mark;
    ps->depth--;
    v->type = NIB_JSON_ARRAY;
    v->n = n;
    v->u.items = items;
    return NIB_OK;
}

static int cmp_key(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c) return c;
    return an < bn ? -1 : an > bn;
}

/* Order by key, then by position, so equal keys sit together, first occurrence first. */
static int cmp_member_ptr(const void *pa, const void *pb) {
    const nib_json_member *a = *(const nib_json_member *const *)pa;
    const nib_json_member *b = *(const nib_json_member *const *)pb;
    int c = cmp_key(a->key, a->key_len, b->key, b->key_len);
    if (c) return c;
    return a->key_offset < b->key_offset ? -1 : a->key_offset > b->key_offset;
}

/* Report the duplicate that appears earliest in the document, naming its first occurrence.
 * sorted is ordered by (key, offset): equal keys form runs, earliest occurrence first. */
static nib_status check_duplicates(parser *ps, const nib_json_member *const *sorted, size_t n) {
    const nib_json_member *dup = NULL, *first = NULL;
    size_t run = 0; /* index of the first member of the current run of equal keys */
    for (size_t i = 1; i < n; i++) {
        const nib_json_member *a = sorted[run], *b = sorted[i];
        if (cmp_key(a->key, a->key_len, b->key, b->key_len) != 0) {
            run = i;
            continue;
        }
        if (i == run + 1 && (!dup || b->key_offset < dup->key_offset)) {
            dup = b;
            first = a;
        }
    }
    if (!dup) return NIB_OK;
    char kb[96];
    return FAIL(ps, (size_t)(dup->key_offset - ps->base),
                "duplicate key \"%s\" (first at byte %llu)",
                show_str(dup->key, dup->key_len, kb, sizeof kb),
                (unsigned long long)first->key_offset);
}

/* Copy the n members on the stack into one arena block: members, their values, the index. */
static nib_status close_object(parser *ps, size_t mark, nib_json_value *v) {
    size_t n = ps->top - mark, per = sizeof(nib_json_member) + sizeof(nib_json_value) +
                                     sizeof(nib_json_member *);
    size_t bytes;
    nib_json_member *members = NULL;
    const nib_json_member **sorted = NULL;
    if (n) {
        if (nib_mul_overflow_size(n, per, &bytes))
            return NIB_ERR(NIB_ERR_OVERFLOW, "json: object of %zu members overflows", n);
        members = arena_alloc(ps->doc, bytes, _Alignof(nib_json_member));
        if (!members) return NIB_ERR_OUT_OF_MEMORY;
        nib_json_value *values = (nib_json_value *)(members + n);
        sorted = (const nib_json_member **)(values + n);
        for (size_t i = 0; i < n; i++) {
            const slot *sl = &ps->stack[mark + i];
            values[i] = sl->value;
            members[i] = (nib_json_member){sl->key, sl->key_len, sl->key_offset, &values[i]};
            sorted[i] = &members[i];
        }
        if (n > 1) qsort(sorted, n, sizeof *sorted, cmp_member_ptr);
        NIB_RETURN_IF_ERR(check_duplicates(ps, sorted, n));
    }
    ps->top = mark;
    v->type = NIB_JSON_OBJECT;
    v->n = n;
    v->u.obj.members = members;
    v->u.obj.sorted = sorted;
    return NIB_OK;
}

static nib_status parse_object(parser *ps, nib_json_value *v) {
    NIB_RETURN_IF_ERR(enter(ps));
    size_t mark = ps->top;
    bool done = false;
    char b[16];
    skip_ws(ps);
    if (ps->pos < ps->len && ps->s[ps->pos] == '}') {
        ps->pos++;
        done = true;
    }
    while (!done) {
        slot sl = {0};
        if (ps->pos >= ps->len || ps->s[ps->pos] != '"')
            return FAIL(ps, ps->pos, "expected a string key, found %s", show_here(ps, b));
        sl.key_offset = ps->base + ps->pos;
        NIB_RETURN_IF_ERR(parse_string(ps, &sl.key, &sl.key_len));
        skip_ws(ps);
        if (ps->pos >= ps->len || ps->s[ps->pos] != ':')
            return FAIL(ps, ps->pos, "expected ':' after key, found %s", show_here(ps, b));
        ps->pos++;
        NIB_RETURN_IF_ERR(parse_value(ps, &sl.value));
        NIB_RETURN_IF_ERR(push_slot(ps, &sl));
        NIB_RETURN_IF_ERR(after_element(ps, '}', &done));
    }
    ps->depth--;
    return close_object(ps, mark, v);
}

/* Any value, after optional whitespace. */
static nib_status parse_value(parser *ps, nib_json_value *v) {
    char b[16];
    skip_ws(ps);
    memset(v, 0, sizeof *v);
    if (ps->pos >= ps->len) return FAIL(ps, ps->pos, "expected a value, found end of input");
    v->offset = ps->base + ps->pos;
    unsigned char c = ps->s[ps->pos];
    switch (c) {
    case '{': return parse_object(ps, v);
    case '[': return parse_array(ps, v);
    case '"':
        v->type = NIB_JSON_STRING;
        return parse_string(ps, &v->u.str, &v->n);
    case 't':
    case 'f':
    case 'n': return parse_literal(ps, v);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps, v);
        return FAIL(ps, ps->pos, "expected a value, found %s", show_byte(c, b));
    }
}

nib_status nib_json_parse(const char *text, size_t len, uint64_t base_offset,
                          nib_json_doc **out) {
    nib_status st = NIB_OK;
    char b[16];
    parser ps = {0};
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "json: NULL output pointer");
    *out = NULL;
    if (!text && len) return NIB_ERR(NIB_ERR_INVALID_ARG, "json: NULL text of %zu bytes", len);
    uint64_t end; /* every offset reported is at most base_offset + len */
    if (nib_add_overflow_u64(base_offset, len, &end))
        return NIB_ERR(NIB_ERR_OVERFLOW, "json: base offset %llu + %zu bytes overflows",
                       (unsigned long long)base_offset, len);
    ps.s = (const unsigned char *)text;
    ps.len = len;
    ps.base = base_offset;
    ps.doc = nib_calloc(1, sizeof *ps.doc);
    if (!ps.doc) return NIB_ERR_OUT_OF_MEMORY;
    skip_ws(&ps);
    if (ps.pos >= ps.len) {
        st = FAIL(&ps, ps.pos, "empty document");
        goto fail;
    }
    NIB_TRY(parse_value(&ps, &ps.doc->root));
    skip_ws(&ps);
    if (ps.pos < ps.len) {
        st = FAIL(&ps, ps.pos, "unexpected %s after the top-level value", show_here(&ps, b));
        goto fail;
    }
    nib_free(ps.stack);
    nib_free(ps.sbuf);
    *out = ps.doc;
    return NIB_OK;
fail:
    nib_free(ps.stack);
    nib_free(ps.sbuf);
    nib_json_free(ps.doc);
    return st;
}

void nib_json_free(nib_json_doc *doc) {
    if (!doc) return;
    for (arena_chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        nib_free(c);
    }
    nib_free(doc);
}

/* ---- accessors --------------------------------------------------------------------------- */

const nib_json_value *nib_json_root(const nib_json_doc *doc) { return doc ? &doc->root : NULL; }

nib_json_type nib_json_type_of(const nib_json_value *v) { return v ? v->type : NIB_JSON_NONE; }

const char *nib_json_type_name(nib_json_type t) {
    static const char *const names[] = {"absent", "null",  "bool",  "number",
                                        "string", "array", "object"};
    return (unsigned)t < NIB_ARRAY_LEN(names) ? names[t] : "invalid";
}

uint64_t nib_json_offset(const nib_json_value *v) { return v ? v->offset : 0; }

size_t nib_json_count(const nib_json_value *v) {
    if (!v || (v->type != NIB_JSON_ARRAY && v->type != NIB_JSON_OBJECT)) return 0;
    return v->n;
}

const nib_json_value *nib_json_elem(const nib_json_value *arr, size_t i) {
    if (!arr || arr->type != NIB_JSON_ARRAY || i >= arr->n) return NULL;
    return &arr->u.items[i];
}

const nib_json_member *nib_json_member_at(const nib_json_value *obj, size_t i) {
    if (!obj || obj->type != NIB_JSON_OBJECT || i >= obj->n) return NULL;
    return &obj->u.obj.members[i];
}

const nib_json_value *nib_json_getn(const nib_json_value *obj, const char *key, size_t key_len) {
    if (!obj || obj->type != NIB_JSON_OBJECT || (!key && key_len)) return NULL;
    size_t lo = 0, hi = obj->n; /* binary search in [lo, hi) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const nib_json_member *m = obj->u.obj.sorted[mid];
        int c = cmp_key(m->key, m->key_len, key ? key : "", key_len);
        if (c == 0) return m->value;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const nib_json_value *nib_json_get(const nib_json_value *obj, const char *key) {
    return key ? nib_json_getn(obj, key, strlen(key)) : NULL;
}

bool nib_json_bool(const nib_json_value *v) { return v && v->type == NIB_JSON_BOOL && v->u.b; }

const char *nib_json_string(const nib_json_value *v, size_t *len) {
    if (!v || v->type != NIB_JSON_STRING) return NULL;
    if (len) *len = v->n;
    return v->u.str;
}

const char *nib_json_number_text(const nib_json_value *v, size_t *len) {
    if (!v || v->type != NIB_JSON_NUMBER) return NULL;
    if (len) *len = v->n;
    return v->u.num.text;
}

double nib_json_double(const nib_json_value *v) {
    if (!v || v->type != NIB_JSON_NUMBER) return NAN;
    return v->u.num.d;
}

nib_status nib_json_int64(const nib_json_value *v, int64_t *out) {
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "json: NULL output pointer");
    if (!v || v->type != NIB_JSON_NUMBER)
        return NIB_ERR(NIB_ERR_FORMAT, "json: expected an integer, found %s at byte %llu",
                       nib_json_type_name(nib_json_type_of(v)),
                       (unsigned long long)nib_json_offset(v));
    const char *t = v->u.num.text;
    const char *more = v->n > 40 ? "..." : "";
    unsigned long long at = (unsigned long long)v->offset;
    bool neg = t[0] == '-';
    if (strpbrk(t, ".eE"))
        return NIB_ERR(NIB_ERR_FORMAT, "json: number %.40s%s at byte %llu is not an integer", t,
                       more, at);
    if (neg && t[1] == '0')
        return NIB_ERR(NIB_ERR_FORMAT, "json: -0 at byte %llu is a float, not an integer", at);
    /* accumulate towards the sign so INT64_MIN is reachable */
    int64_t x = 0;
    for (const char *p = t + neg; *p; p++) {
        int64_t d = *p - '0';
        if (__builtin_mul_overflow(x, 10, &x) ||
            (neg ? __builtin_sub_overflow(x, d, &x) : __builtin_add_overflow(x, d, &x)))
            return NIB_ERR(NIB_ERR_FORMAT,
                           "json: integer %.40s%s at byte %llu does not fit in int64", t, more,
                           at);
    }
    *out = x;
    return NIB_OK;
}

/* ---- escaping ---------------------------------------------------------------------------- */

/* The escaped form of the character at s (avail bytes left): points *unit at it (tmp or s
 * itself), sets *adv to the input bytes it consumes and returns its length. */
static size_t escape_unit(const unsigned char *s, size_t avail, char tmp[8], const char **unit,
                          size_t *adv) {
    static const char shorts[] = "\b\f\n\r\t", letters[] = "bfnrt"; /* \b \f \n \r \t */
    unsigned char c = s[0];
    const char *why, *sh = c ? strchr(shorts, c) : NULL;
    *unit = tmp;
    *adv = 1;
    if (c == '"' || c == '\\' || sh) {
        tmp[0] = '\\';
        tmp[1] = sh ? letters[sh - shorts] : (char)c;
        return 2;
    }
    if (c < 0x20 || c == 0x7F) {
        snprintf(tmp, 8, "\\u%04x", c);
        return 6;
    }
    if (c < 0x80) {
        *unit = (const char *)s;
        return 1;
    }
    *adv = utf8_seq(s, avail, &why);
    if (*adv == 0) {
        *adv = 1;
        *unit = "\\ufffd"; /* an invalid byte: the replacement character */
        return 6;
    }
    if (c == 0xC2 && s[1] < 0xA0) {
        snprintf(tmp, 8, "\\u%04x", s[1]); /* C1 control U+0080..U+009F */
        return 6;
    }
    *unit = (const char *)s;
    return *adv;
}

size_t nib_json_escape(char *dst, size_t cap, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t full = 0, w = 0; /* full: length of the whole escaped text; w: bytes written */
    bool room = cap > 0;
    for (size_t i = 0; i < n;) {
        char tmp[8];
        const char *unit;
        size_t adv, ulen = escape_unit(u + i, n - i, tmp, &unit, &adv);
        if (room && w + ulen < cap) {
            memcpy(dst + w, unit, ulen);
            w += ulen;
        } else {
            room = false; /* stop at the first unit that does not fit: never split one */
        }
        full += ulen;
        i += adv;
    }
    if (cap > 0) dst[w] = '\0';
    return full;
}
