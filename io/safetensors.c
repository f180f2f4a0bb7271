/* safetensors.c — the validated zero-copy reader (mmap) and the streaming writer.
 *
 * Reader: check the 8-byte length prefix, parse the header with the strict JSON parser (file
 * offsets in every message), turn each entry into an nib_st_tensor with every size checked,
 * sort by data offset and require an exact tiling of the data section, then drop the JSON tree.
 * What stays allocated is the tensor table, a by-name index and one pool of name/metadata
 * strings, all bounded by the header size.
 *
 * Writer: keeps only the declarations (names, shapes) in memory; the header is built from them
 * before the first data byte, and data bytes are streamed straight to "<path>.tmp". */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors.h"

struct nib_st_file {
    const unsigned char *base;     /* the file's bytes [0, size) */
    uint64_t size;
    void *map;                     /* our mapping of map_len bytes; NULL for caller memory */
    size_t map_len;
    uint64_t header_len;           /* N */
    const unsigned char *data;     /* base + 8 + N */
    uint64_t data_size;            /* size - 8 - N */
    nib_st_tensor *tensors;        /* n_tensors, sorted by (begin, end) */
    size_t n_tensors;
    const nib_st_tensor **by_name; /* n_tensors, sorted by name */
    nib_st_kv *meta;               /* n_meta, header order */
    size_t n_meta;
    char *strings;                 /* pool: names, metadata keys and values, NUL-terminated */
};

#define ST_METADATA_KEY "__metadata__"
#define ST_PREFIX_BYTES 8 /* the u64 header length */
#define ST_SHOW_NAME 96   /* bytes of an (escaped) name shown in messages */

/* ---- messages ---------------------------------------------------------------------------- */

/* "safetensors: <what> (byte N)", N a file offset. */
static nib_status st_failv(nib_status st, int line, uint64_t at, const char *who,
                           const char *fmt, va_list ap) {
    char what[768];
    vsnprintf(what, sizeof what, fmt, ap);
    if (who)
        return nib_set_error(st, __FILE__, line, "safetensors: tensor '%s' %s (byte %llu)", who,
                             what, (unsigned long long)at);
    return nib_set_error(st, __FILE__, line, "safetensors: %s (byte %llu)", what,
                         (unsigned long long)at);
}
static nib_status st_fail(nib_status st, int line, uint64_t at, const char *fmt, ...)
    NIB_PRINTF(4, 5);
static nib_status st_fail(nib_status st, int line, uint64_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    st_failv(st, line, at, NULL, fmt, ap);
    va_end(ap);
    return st;
}
/* The same about one tensor: "safetensors: tensor '<shown>' <what> (byte N)", where shown is
 * the display form of its name (show_name). */
static nib_status tensor_fail(nib_status st, int line, uint64_t at, const char *shown,
                              const char *fmt, ...) NIB_PRINTF(5, 6);
static nib_status tensor_fail(nib_status st, int line, uint64_t at, const char *shown,
                              const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    st_failv(st, line, at, shown, fmt, ap);
    va_end(ap);
    return st;
}
#define ST_FAIL(st, at, ...) st_fail((st), __LINE__, (at), __VA_ARGS__)
#define TENSOR_FAIL(st, shown, at, ...) tensor_fail((st), __LINE__, (at), (shown), __VA_ARGS__)

/* Escaped (control characters never reach a terminal), truncated name for messages. */
static const char *show_name(char buf[ST_SHOW_NAME], const char *s, size_t n) {
    if (nib_json_escape(buf, ST_SHOW_NAME - 3, s, n) >= ST_SHOW_NAME - 3) strcat(buf, "...");
    return buf;
}

/* "[2, 3]" */
static const char *show_dims(char *buf, size_t cap, const int64_t *dims, int32_t n) {
    size_t w = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < n && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (w < cap) snprintf(buf + w, cap - w, "]");
    return buf;
}

/* ---- header prefix ------------------------------------------------------------------------- */

static uint64_t read_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The length prefix and the first header byte; sets header_len, data, data_size. */
static nib_status check_prefix(nib_st_file *f) {
    uint64_t n, end;
    if (f->size < ST_PREFIX_BYTES)
        return ST_FAIL(NIB_ERR_FORMAT, 0,
                       "file of %llu bytes is shorter than the 8-byte header length",
                       (unsigned long long)f->size);
    n = read_le64(f->base);
    if (nib_add_overflow_u64(ST_PREFIX_BYTES, n, &end))
        return ST_FAIL(NIB_ERR_OVERFLOW, 0, "header length %llu overflows 8 + length",
                       (unsigned long long)n);
    if (n > NIB_ST_MAX_HEADER_BYTES)
        return ST_FAIL(NIB_ERR_FORMAT, 0, "header length %llu exceeds the limit of %llu bytes",
                       (unsigned long long)n, (unsigned long long)NIB_ST_MAX_HEADER_BYTES);
    if (end > f->size)
        return ST_FAIL(NIB_ERR_FORMAT, 0,
                       "header length %llu runs past the end of the %llu-byte file",
                       (unsigned long long)n, (unsigned long long)f->size);
    if (n == 0) return ST_FAIL(NIB_ERR_FORMAT, ST_PREFIX_BYTES, "header is empty");
    if (f->base[ST_PREFIX_BYTES] != '{')
        return ST_FAIL(NIB_ERR_FORMAT, ST_PREFIX_BYTES,
                       "header must begin with '{', found byte 0x%02X",
                       f->base[ST_PREFIX_BYTES]);
    f->header_len = n;
    f->data = f->base + end;
    f->data_size = f->size - end;
    return NIB_OK;
}

/* The JSON body was parsed from header[0, body): everything after the object's closing '}'
 * must be a space. JSON allows tab/CR/LF there too; the format does not. */
static nib_status check_padding(const nib_st_file *f, size_t body) {
    const unsigned char *h = f->base + ST_PREFIX_BYTES;
    size_t close = body;
    while (close > 0 && h[close - 1] != '}') close--;
    for (size_t i = close; i < body; i++)
        if (h[i] != ' ')
            return ST_FAIL(NIB_ERR_FORMAT, ST_PREFIX_BYTES + i,
                           "header padding byte 0x%02X is not a space (0x20)", h[i]);
    return NIB_OK;
}

/* ---- one tensor entry -------------------------------------------------------------------- */

static bool key_is(const nib_json_member *m, const char *key) {
    return m->key_len == strlen(key) && memcmp(m->key, key, m->key_len) == 0;
}

typedef struct entry_fields {
    const nib_json_value *dtype, *shape, *offsets;
} entry_fields;

/* The entry must be an object with exactly dtype, shape and data_offsets. */
static nib_status read_fields(const char *shown, const nib_json_value *e, entry_fields *ef) {
    if (nib_json_type_of(e) != NIB_JSON_OBJECT)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(e),
                           "entry is a%s %s, not an object",
                           nib_json_type_of(e) == NIB_JSON_ARRAY ? "n" : "",
                           nib_json_type_name(nib_json_type_of(e)));
    memset(ef, 0, sizeof *ef);
    for (size_t i = 0; i < nib_json_count(e); i++) {
        const nib_json_member *m = nib_json_member_at(e, i);
        char kb[ST_SHOW_NAME];
        if (key_is(m, "dtype")) ef->dtype = m->value;
        else if (key_is(m, "shape")) ef->shape = m->value;
        else if (key_is(m, "data_offsets")) ef->offsets = m->value;
        else
            return TENSOR_FAIL(NIB_ERR_FORMAT, shown, m->key_offset,
                               "has unknown key \"%s\" (allowed: dtype, shape, data_offsets)",
                               show_name(kb, m->key, m->key_len));
    }
    const char *missing = !ef->dtype     ? "dtype"
                          : !ef->shape   ? "shape"
                          : !ef->offsets ? "data_offsets"
                                         : NULL;
    if (missing)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(e), "entry has no \"%s\"",
                           missing);
    return NIB_OK;
}

static nib_status read_dtype(const char *shown, const nib_json_value *v, nib_dtype *dt) {
    size_t n;
    const char *s = nib_json_string(v, &n);
    char b[ST_SHOW_NAME];
    if (!s)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v),
                           "dtype must be a string, found %s",
                           nib_json_type_name(nib_json_type_of(v)));
    *dt = nib_dtype_from_name(s, n);
    if (*dt == NIB_DTYPE_INVALID)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v),
                           "has unknown dtype \"%s\" (known: BOOL, U8, I8, U16, I16, U32, I32, "
                           "U64, I64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2, F8_E8M0)",
                           show_name(b, s, n));
    return NIB_OK;
}

/* A non-negative JSON integer; `what` names the field ("shape[2]"). */
static nib_status read_count(const char *shown, const char *what, const nib_json_value *v,
                             int64_t *out) {
    nib_status st = nib_json_int64(v, out);
    if (st != NIB_OK) return nib_error_context(st, "safetensors: tensor '%s' %s", shown, what);
    if (*out < 0)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v), "%s is negative (%lld)",
                           what, (long long)*out);
    return NIB_OK;
}

static nib_status read_shape(const char *shown, const nib_json_value *v, nib_st_tensor *t) {
    if (nib_json_type_of(v) != NIB_JSON_ARRAY)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v),
                           "shape must be an array, found %s",
                           nib_json_type_name(nib_json_type_of(v)));
    size_t n = nib_json_count(v);
    if (n > NIB_MAX_DIMS)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v),
                           "shape has %zu dimensions, more than %d", n, NIB_MAX_DIMS);
    for (size_t i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "shape[%zu]", i);
        NIB_RETURN_IF_ERR(read_count(shown, what, nib_json_elem(v, i), &t->shape[i]));
    }
    t->ndim = (int32_t)n;
    return NIB_OK;
}

static nib_status read_offsets(const char *shown, const nib_json_value *v, nib_st_tensor *t) {
    int64_t b, e;
    if (nib_json_type_of(v) != NIB_JSON_ARRAY || nib_json_count(v) != 2)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v),
                           "data_offsets must be an array of 2 integers, found %s of %zu",
                           nib_json_type_name(nib_json_type_of(v)), nib_json_count(v));
    NIB_RETURN_IF_ERR(read_count(shown, "data_offsets[0]", nib_json_elem(v, 0), &b));
    NIB_RETURN_IF_ERR(read_count(shown, "data_offsets[1]", nib_json_elem(v, 1), &e));
    if (b > e)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, nib_json_offset(v),
                           "data_offsets [%lld, %lld] begin after end", (long long)b,
                           (long long)e);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    t->nbytes = t->end - t->begin;
    return NIB_OK;
}

/* The byte count the shape implies must be exactly the span of data_offsets, inside the data
 * section. nib_tensor_desc_init does the overflow-checked product. */
static nib_status check_extent(const nib_st_file *f, const char *shown, const nib_json_value *v,
                               nib_st_tensor *t) {
    nib_tensor_desc d;
    char dims[256];
    uint64_t at = nib_json_offset(v);
    nib_status st = nib_tensor_desc_init(&d, t->dtype, t->ndim, t->shape);
    if (st == NIB_ERR_OVERFLOW)
        return TENSOR_FAIL(NIB_ERR_OVERFLOW, shown, at, "shape %s of %s: the byte count overflows",
                           show_dims(dims, sizeof dims, t->shape, t->ndim),
                           nib_dtype_name(t->dtype));
    if (st != NIB_OK) /* not expected: dtype, rank and dims were validated above */
        return nib_error_context(st, "safetensors: tensor '%s'", shown);
    if (d.nbytes != t->nbytes)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, at,
                           "shape %s of %s is %llu bytes but data_offsets [%llu, %llu] span %llu",
                           show_dims(dims, sizeof dims, t->shape, t->ndim),
                           nib_dtype_name(t->dtype), (unsigned long long)d.nbytes,
                           (unsigned long long)t->begin, (unsigned long long)t->end,
                           (unsigned long long)t->nbytes);
    if (t->end > f->data_size)
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, at,
                           "data_offsets [%llu, %llu] end exceeds the data section of %llu bytes",
                           (unsigned long long)t->begin, (unsigned long long)t->end,
                           (unsigned long long)f->data_size);
    t->numel = d.numel;
    return NIB_OK;
}

/* Copy n bytes and a NUL into the string pool. */
static const char *pool_put(char **pool, const char *s, size_t n) {
    char *p = *pool;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    *pool += n + 1;
    return p;
}

static nib_status read_tensor(nib_st_file *f, const nib_json_member *m, char **pool,
                              nib_st_tensor *t) {
    char shown[ST_SHOW_NAME];
    entry_fields ef;
    show_name(shown, m->key, m->key_len);
    if (m->key_len == 0) return ST_FAIL(NIB_ERR_FORMAT, m->key_offset, "empty tensor name");
    if (memchr(m->key, '\0', m->key_len))
        return TENSOR_FAIL(NIB_ERR_FORMAT, shown, m->key_offset, "name contains a NUL byte");
    NIB_RETURN_IF_ERR(read_fields(shown, m->value, &ef));
    NIB_RETURN_IF_ERR(read_dtype(shown, ef.dtype, &t->dtype));
    NIB_RETURN_IF_ERR(read_shape(shown, ef.shape, t));
    NIB_RETURN_IF_ERR(read_offsets(shown, ef.offsets, t));
    NIB_RETURN_IF_ERR(check_extent(f, shown, ef.offsets, t));
    t->name = pool_put(pool, m->key, m->key_len);
    t->name_len = m->key_len;
    t->file_offset = ST_PREFIX_BYTES + f->header_len + t->begin;
    t->entry_offset = m->key_offset;
    t->data = f->data + t->begin;
    return NIB_OK;
}

/* "__metadata__": an object whose values are all strings. */
static nib_status read_metadata(nib_st_file *f, const nib_json_value *v, char **pool) {
    if (nib_json_type_of(v) != NIB_JSON_OBJECT)
        return ST_FAIL(NIB_ERR_FORMAT, nib_json_offset(v),
                       ST_METADATA_KEY " must be an object of strings, found %s",
                       nib_json_type_name(nib_json_type_of(v)));
    for (size_t i = 0; i < nib_json_count(v); i++) {
        const nib_json_member *m = nib_json_member_at(v, i);
        char kb[ST_SHOW_NAME];
        size_t n;
        const char *s = nib_json_string(m->value, &n);
        if (!s)
            return ST_FAIL(NIB_ERR_FORMAT, nib_json_offset(m->value),
                           ST_METADATA_KEY " value of key \"%s\" is %s, not a string",
                           show_name(kb, m->key, m->key_len),
                           nib_json_type_name(nib_json_type_of(m->value)));
        if (memchr(m->key, '\0', m->key_len))
            return ST_FAIL(NIB_ERR_FORMAT, m->key_offset,
                           ST_METADATA_KEY " key \"%s\" contains a NUL byte",
                           show_name(kb, m->key, m->key_len));
        nib_st_kv *kv = &f->meta[f->n_meta++];
        kv->key = pool_put(pool, m->key, m->key_len);
        kv->key_len = m->key_len;
        kv->value = pool_put(pool, s, n);
        kv->value_len = n;
    }
    return NIB_OK;
}

/* ---- whole header ------------------------------------------------------------------------ */

/* Count tensors and metadata entries and the pool bytes for their strings. The counts are
 * bounded by the header size (each entry takes several header bytes), as is the pool. */
static nib_status plan_sizes(const nib_json_value *root, size_t *n_tensors, size_t *n_meta,
                             size_t *pool) {
    size_t p = 0, nt = 0, nm = 0;
    bool ovf = false;
    for (size_t i = 0; i < nib_json_count(root); i++) {
        const nib_json_member *m = nib_json_member_at(root, i);
        if (!key_is(m, ST_METADATA_KEY)) {
            nt++;
            ovf |= nib_add_overflow_size(p, m->key_len + 1, &p);
            continue;
        }
        /* member_at is NULL past the end and for a non-object (rejected later) */
        const nib_json_member *kv;
        for (size_t j = 0; (kv = nib_json_member_at(m->value, j)) != NULL; j++) {
            size_t vlen = 0;
            nib_json_string(kv->value, &vlen);
            ovf |= nib_add_overflow_size(p, kv->key_len + 1, &p);
            ovf |= nib_add_overflow_size(p, vlen + 1, &p);
            nm++;
        }
    }
    if (ovf) return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors: header string sizes overflow");
    *n_tensors = nt;
    *n_meta = nm;
    *pool = p;
    return NIB_OK;
}

/* File order; ties (zero-size tensors at one offset) keep header order. */
static int cmp_by_offset(const void *pa, const void *pb) {
    const nib_st_tensor *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->entry_offset < b->entry_offset ? -1 : a->entry_offset > b->entry_offset;
}

static nib_status read_header(nib_st_file *f, const nib_json_value *root) {
    size_t n_tensors = 0, n_meta = 0, pool_bytes = 0;
    NIB_RETURN_IF_ERR(plan_sizes(root, &n_tensors, &n_meta, &pool_bytes));
    f->tensors = nib_calloc(n_tensors, sizeof *f->tensors);
    f->meta = nib_calloc(n_meta, sizeof *f->meta);
    f->strings = nib_malloc(pool_bytes);
    if (!f->tensors || !f->meta || !f->strings) return NIB_ERR_OUT_OF_MEMORY;
    char *pool = f->strings;
    for (size_t i = 0; i < nib_json_count(root); i++) {
        const nib_json_member *m = nib_json_member_at(root, i);
        if (key_is(m, ST_METADATA_KEY)) {
            NIB_RETURN_IF_ERR(read_metadata(f, m->value, &pool));
        } else {
            NIB_RETURN_IF_ERR(read_tensor(f, m, &pool, &f->tensors[f->n_tensors]));
            f->n_tensors++;
        }
    }
    if (f->n_tensors > 1) qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_by_offset);
    return NIB_OK;
}

/* Sorted by offset, each tensor must begin where the previous one ended, the first at 0 and
 * the last ending at the end of the data section: no holes (room for a polyglot payload), no
 * overlaps (aliasing, allocation amplification), no trailing bytes. */
static nib_status check_tiling(const nib_st_file *f) {
    uint64_t cursor = 0;
    const nib_st_tensor *prev = NULL;
    char a[ST_SHOW_NAME], b[ST_SHOW_NAME];
    for (size_t i = 0; i < f->n_tensors; i++) {
        const nib_st_tensor *t = &f->tensors[i];
        const char *shown = show_name(a, t->name, t->name_len);
        if (t->begin != cursor && !prev)
            return TENSOR_FAIL(NIB_ERR_FORMAT, shown, t->entry_offset,
                               "data_offsets [%llu, %llu]: no tensor starts at offset 0 of the "
                               "data section",
                               (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->begin > cursor)
            return TENSOR_FAIL(NIB_ERR_FORMAT, shown, t->entry_offset,
                               "data_offsets [%llu, %llu] leave a hole of %llu bytes after "
                               "tensor '%s' [%llu, %llu]",
                               (unsigned long long)t->begin, (unsigned long long)t->end,
                               (unsigned long long)(t->begin - cursor),
                               show_name(b, prev->name, prev->name_len),
                               (unsigned long long)prev->begin, (unsigned long long)prev->end);
        if (t->begin < cursor)
            return TENSOR_FAIL(NIB_ERR_FORMAT, shown, t->entry_offset,
                               "data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
                               (unsigned long long)t->begin, (unsigned long long)t->end,
                               show_name(b, prev->name, prev->name_len),
                               (unsigned long long)prev->begin, (unsigned long long)prev->end);
        cursor = t->end;
        prev = t;
    }
    if (cursor != f->data_size)
        return ST_FAIL(NIB_ERR_FORMAT, ST_PREFIX_BYTES + f->header_len + cursor,
                       "data section of %llu bytes has trailing bytes [%llu, %llu) that belong "
                       "to no tensor",
                       (unsigned long long)f->data_size, (unsigned long long)cursor,
                       (unsigned long long)f->data_size);
    return NIB_OK;
}

static int cmp_name(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c) return c;
    return an < bn ? -1 : an > bn;
}

static int cmp_tensor_ptr_name(const void *pa, const void *pb) {
    const nib_st_tensor *a = *(const nib_st_tensor *const *)pa;
    const nib_st_tensor *b = *(const nib_st_tensor *const *)pb;
    return cmp_name(a->name, a->name_len, b->name, b->name_len);
}

static nib_status index_names(nib_st_file *f) {
    f->by_name = nib_calloc(f->n_tensors, sizeof *f->by_name);
    if (!f->by_name) return NIB_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < f->n_tensors; i++) f->by_name[i] = &f->tensors[i];
    if (f->n_tensors > 1)
        qsort(f->by_name, f->n_tensors, sizeof *f->by_name, cmp_tensor_ptr_name);
    return NIB_OK;
}

static nib_status validate(nib_st_file *f) {
    nib_status st = NIB_OK;
    nib_json_doc *doc = NULL;
    NIB_TRY(check_prefix(f));
    /* the JSON body: the header minus its trailing space padding */
    const char *hdr = (const char *)f->base + ST_PREFIX_BYTES;
    size_t body = (size_t)f->header_len;
    while (body > 0 && hdr[body - 1] == ' ') body--;
    st = nib_json_parse(hdr, body, ST_PREFIX_BYTES, &doc);
    if (st != NIB_OK) {
        nib_error_context(st, "safetensors: header");
        goto fail;
    }
    NIB_TRY(check_padding(f, body));
    NIB_TRY(read_header(f, nib_json_root(doc)));
    NIB_TRY(check_tiling(f));
    NIB_TRY(index_names(f));
fail:
    nib_json_free(doc);
    return st;
}

/* Takes ownership of map (unmapped on failure). */
static nib_status open_bytes(const void *base, uint64_t size, void *map, size_t map_len,
                             nib_st_file **out) {
    nib_status st = NIB_OK;
    nib_st_file *f = nib_calloc(1, sizeof *f);
    if (!f) {
        if (map) munmap(map, map_len);
        return NIB_ERR_OUT_OF_MEMORY;
    }
    f->base = base;
    f->size = size;
    f->map = map;
    f->map_len = map_len;
    NIB_TRY(validate(f));
    *out = f;
    return NIB_OK;
fail:
    nib_st_close(f);
    return st;
}

nib_status nib_st_open_memory(const void *buf, size_t len, nib_st_file **out) {
    if (!out) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors: NULL output pointer");
    *out = NULL;
    if (!buf && len)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors: NULL buffer of %zu bytes", len);
    return open_bytes(buf, len, NULL, 0, out);
}

nib_status nib_st_open(const char *path, nib_st_file **out) {
    nib_status st = NIB_OK;
    struct stat sb;
    void *map = NULL;
    int fd = -1;
    if (!out || !path) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors: NULL path or output");
    *out = NULL;
    /* O_NONBLOCK: a FIFO must not hang the open; it is rejected below as not a regular file */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors: cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors: cannot stat '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors: '%s' is not a regular file", path);
        goto fail;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = NIB_ERR(NIB_ERR_OVERFLOW, "safetensors: '%s' of %lld bytes does not fit in memory",
                     path, (long long)sb.st_size);
        goto fail;
    }
    size_t len = (size_t)sb.st_size;
    if (len > 0) { /* mmap of 0 bytes is an error; such a file fails the size check instead */
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            st = NIB_ERR(NIB_ERR_IO, "safetensors: cannot map '%s': %s", path, strerror(errno));
            goto fail;
        }
    }
    close(fd);
    st = open_bytes(map, len, map, len, out);
    if (st != NIB_OK) nib_error_context(st, "%s", path);
    return st;
fail:
    if (fd >= 0) close(fd);
    return st;
}

void nib_st_close(nib_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    nib_free(f->tensors);
    nib_free(f->by_name);
    nib_free(f->meta);
    nib_free(f->strings);
    nib_free(f);
}

/* ---- accessors --------------------------------------------------------------------------- */

size_t nib_st_count(const nib_st_file *f) { return f ? f->n_tensors : 0; }

const nib_st_tensor *nib_st_tensor_at(const nib_st_file *f, size_t i) {
    return f && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const nib_st_tensor *nib_st_find(const nib_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    size_t n = strlen(name), lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_name(f->by_name[mid]->name, f->by_name[mid]->name_len, name, n);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

size_t nib_st_metadata_count(const nib_st_file *f) { return f ? f->n_meta : 0; }

const nib_st_kv *nib_st_metadata_at(const nib_st_file *f, size_t i) {
    return f && i < f->n_meta ? &f->meta[i] : NULL;
}

const nib_st_kv *nib_st_metadata_find(const nib_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, key)) return &f->meta[i];
    return NULL;
}

const void *nib_st_data(const nib_st_file *f) { return f ? f->data : NULL; }
uint64_t nib_st_data_size(const nib_st_file *f) { return f ? f->data_size : 0; }
uint64_t nib_st_header_size(const nib_st_file *f) { return f ? f->header_len : 0; }
uint64_t nib_st_file_size(const nib_st_file *f) { return f ? f->size : 0; }

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct st_decl {
    char *name;
    nib_dtype dtype;
    int32_t ndim;
    int64_t shape[NIB_MAX_DIMS];
    uint64_t nbytes;
} st_decl;

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct nib_st_writer {
    char *path;            /* final name */
    char *tmp_path;        /* "<path>.tmp": receives every byte until finish renames it */
    FILE *f;
    bool tmp_created;      /* remove tmp_path on failure only if we created it */
    st_decl *decls;        /* file order */
    size_t n_decls, cap_decls;
    size_t *name_set;      /* open addressing over decls: index + 1, 0 = empty */
    size_t set_cap;        /* power of two, at least 2 * (n_decls + 1) */
    st_meta *meta;
    size_t n_meta, cap_meta;
    uint64_t data_total;   /* sum of the declared nbytes */
    uint64_t written;      /* data bytes written so far */
    bool header_written;
    nib_status failed;     /* first error of a write; sticky */
};

/* A block with room for `need` elements of `elem` bytes, from p of capacity *cap (doubling);
 * *out is the possibly moved block. On failure p is untouched. */
static nib_status grow(void *p, size_t *cap, size_t need, size_t elem, void **out) {
    *out = p;
    if (need <= *cap) return NIB_OK;
    size_t ncap = *cap ? *cap : 16, bytes;
    while (ncap < need)
        if (nib_mul_overflow_size(ncap, 2, &ncap))
            return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: table of %zu entries overflows",
                           need);
    if (nib_mul_overflow_size(ncap, elem, &bytes))
        return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: table of %zu entries overflows",
                       ncap);
    void *np = nib_realloc(p, bytes);
    if (!np) return NIB_ERR_OUT_OF_MEMORY;
    *out = np;
    *cap = ncap;
    return NIB_OK;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The set slot holding `name`, or the empty slot where it would go. */
static size_t *name_slot(const nib_st_writer *w, const char *name) {
    size_t mask = w->set_cap - 1;
    for (size_t i = (size_t)fnv1a(name) & mask;; i = (i + 1) & mask) {
        size_t *s = &w->name_set[i];
        if (*s == 0 || !strcmp(w->decls[*s - 1].name, name)) return s;
    }
}

/* Keep the name set at most half full so probes stay short (and always end). */
static nib_status reserve_name(nib_st_writer *w) {
    size_t need;
    if (nib_mul_overflow_size(w->n_decls + 1, 2, &need))
        return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: too many tensors");
    if (need <= w->set_cap) return NIB_OK;
    size_t cap = w->set_cap ? w->set_cap : 64;
    while (cap < need)
        if (nib_mul_overflow_size(cap, 2, &cap))
            return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: too many tensors");
    size_t *set = nib_calloc(cap, sizeof *set);
    if (!set) return NIB_ERR_OUT_OF_MEMORY;
    nib_free(w->name_set);
    w->name_set = set;
    w->set_cap = cap;
    for (size_t i = 0; i < w->n_decls; i++) *name_slot(w, w->decls[i].name) = i + 1;
    return NIB_OK;
}

/* Declarations and metadata are allowed only before the header is out. */
static nib_status check_declaring(const nib_st_writer *w, const char *what) {
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: %s on a NULL writer", what);
    if (w->failed)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: %s after a failed write", what);
    if (w->header_written)
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "safetensors writer: %s after data was written (the header is out)", what);
    return NIB_OK;
}

static nib_status check_text(const char *s, const char *what) {
    size_t bad;
    if (!s) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: NULL %s", what);
    if (!nib_json_utf8_valid(s, strlen(s), &bad))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: %s is not valid UTF-8 (byte %zu)",
                       what, bad);
    return NIB_OK;
}

nib_status nib_st_writer_create(const char *path, nib_st_writer **out) {
    nib_status st = NIB_OK;
    nib_st_writer *w = NULL;
    size_t n, tmp_bytes;
    if (!out || !path || !*path)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: NULL or empty path");
    *out = NULL;
    n = strlen(path);
    if (nib_add_overflow_size(n, sizeof ".tmp", &tmp_bytes))
        return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: path length overflows");
    w = nib_calloc(1, sizeof *w);
    if (!w) return NIB_ERR_OUT_OF_MEMORY;
    w->path = nib_strdup(path);
    w->tmp_path = nib_malloc(tmp_bytes);
    if (!w->path || !w->tmp_path) {
        st = NIB_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    memcpy(w->tmp_path, path, n);
    memcpy(w->tmp_path + n, ".tmp", sizeof ".tmp");
    /* O_NOFOLLOW: a symlink planted at path.tmp must not redirect the write elsewhere */
    int fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors writer: cannot create '%s': %s", w->tmp_path,
                     strerror(errno));
        goto fail;
    }
    w->tmp_created = true;
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors writer: cannot open '%s': %s", w->tmp_path,
                     strerror(errno));
        close(fd);
        goto fail;
    }
    *out = w;
    return NIB_OK;
fail:
    nib_st_writer_abort(w);
    return st;
}

nib_status nib_st_writer_declare(nib_st_writer *w, const char *name, nib_dtype dt,
                                 int32_t ndim, const int64_t *shape) {
    nib_tensor_desc d;
    uint64_t total;
    char shown[ST_SHOW_NAME];
    NIB_RETURN_IF_ERR(check_declaring(w, "declare"));
    NIB_RETURN_IF_ERR(check_text(name, "tensor name"));
    show_name(shown, name, strlen(name));
    if (!name[0]) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: empty tensor name");
    if (!strcmp(name, ST_METADATA_KEY))
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "safetensors writer: \"" ST_METADATA_KEY "\" is not a tensor name");
    nib_status st = nib_tensor_desc_init(&d, dt, ndim, shape);
    if (st != NIB_OK) return nib_error_context(st, "safetensors writer: tensor '%s'", shown);
    if (nib_add_overflow_u64(w->data_total, d.nbytes, &total))
        return NIB_ERR(NIB_ERR_OVERFLOW,
                       "safetensors writer: tensor '%s' of %llu bytes overflows the data size",
                       shown, (unsigned long long)d.nbytes);
    NIB_RETURN_IF_ERR(reserve_name(w));
    size_t *slot = name_slot(w, name);
    if (*slot)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: tensor '%s' declared twice",
                       shown);
    void *grown;
    NIB_RETURN_IF_ERR(grow(w->decls, &w->cap_decls, w->n_decls + 1, sizeof *w->decls, &grown));
    w->decls = grown;
    st_decl *e = &w->decls[w->n_decls];
    memset(e, 0, sizeof *e);
    e->name = nib_strdup(name);
    if (!e->name) return NIB_ERR_OUT_OF_MEMORY;
    e->dtype = dt;
    e->ndim = ndim;
    if (ndim > 0) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->nbytes = d.nbytes;
    *slot = ++w->n_decls;
    w->data_total = total;
    return NIB_OK;
}

nib_status nib_st_writer_set_metadata(nib_st_writer *w, const char *key, const char *value) {
    NIB_RETURN_IF_ERR(check_declaring(w, "set_metadata"));
    NIB_RETURN_IF_ERR(check_text(key, "metadata key"));
    NIB_RETURN_IF_ERR(check_text(value, "metadata value"));
    char *v = nib_strdup(value);
    if (!v) return NIB_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < w->n_meta; i++) {
        if (!strcmp(w->meta[i].key, key)) {
            nib_free(w->meta[i].value);
            w->meta[i].value = v;
            return NIB_OK;
        }
    }
    void *grown;
    char *k = nib_strdup(key);
    nib_status st = k ? grow(w->meta, &w->cap_meta, w->n_meta + 1, sizeof *w->meta, &grown)
                      : NIB_ERR_OUT_OF_MEMORY;
    if (st != NIB_OK) {
        nib_free(k);
        nib_free(v);
        return st;
    }
    w->meta = grown;
    w->meta[w->n_meta++] = (st_meta){k, v};
    return NIB_OK;
}

/* ---- header text ---- */

typedef struct hbuf {
    char *p;
    size_t len, cap;
} hbuf;

static nib_status hb_reserve(hbuf *b, size_t extra) {
    size_t need;
    if (nib_add_overflow_size(b->len, extra, &need) || nib_add_overflow_size(need, 1, &need))
        return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: header size overflows");
    void *grown;
    NIB_RETURN_IF_ERR(grow(b->p, &b->cap, need, 1, &grown));
    b->p = grown;
    return NIB_OK;
}

static nib_status hb_put(hbuf *b, const char *s, size_t n) {
    NIB_RETURN_IF_ERR(hb_reserve(b, n));
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return NIB_OK;
}

static nib_status hb_str(hbuf *b, const char *s) {
    size_t n = strlen(s), esc = nib_json_escape(NULL, 0, s, n);
    NIB_RETURN_IF_ERR(hb_put(b, "\"", 1));
    NIB_RETURN_IF_ERR(hb_reserve(b, esc));
    nib_json_escape(b->p + b->len, esc + 1, s, n);
    b->len += esc;
    return hb_put(b, "\"", 1);
}

static nib_status hb_u64(hbuf *b, uint64_t x) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)x);
    return hb_put(b, tmp, (size_t)n);
}

static nib_status hb_tensor(hbuf *b, const st_decl *e, uint64_t begin) {
    const char *dt = nib_dtype_name(e->dtype);
    NIB_RETURN_IF_ERR(hb_str(b, e->name));
    NIB_RETURN_IF_ERR(hb_put(b, ":{\"dtype\":\"", 11));
    NIB_RETURN_IF_ERR(hb_put(b, dt, strlen(dt)));
    NIB_RETURN_IF_ERR(hb_put(b, "\",\"shape\":[", 11));
    for (int32_t i = 0; i < e->ndim; i++) {
        if (i) NIB_RETURN_IF_ERR(hb_put(b, ",", 1));
        NIB_RETURN_IF_ERR(hb_u64(b, (uint64_t)e->shape[i]));
    }
    NIB_RETURN_IF_ERR(hb_put(b, "],\"data_offsets\":[", 18));
    NIB_RETURN_IF_ERR(hb_u64(b, begin));
    NIB_RETURN_IF_ERR(hb_put(b, ",", 1));
    NIB_RETURN_IF_ERR(hb_u64(b, begin + e->nbytes)); /* <= data_total: checked at declare */
    return hb_put(b, "]}", 2);
}

/* {"__metadata__":{...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...} padded with
 * spaces so that the data section starts at a multiple of 8. */
static nib_status build_header(const nib_st_writer *w, hbuf *b) {
    NIB_RETURN_IF_ERR(hb_put(b, "{", 1));
    if (w->n_meta) {
        NIB_RETURN_IF_ERR(hb_put(b, "\"" ST_METADATA_KEY "\":{", sizeof ST_METADATA_KEY + 3));
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i) NIB_RETURN_IF_ERR(hb_put(b, ",", 1));
            NIB_RETURN_IF_ERR(hb_str(b, w->meta[i].key));
            NIB_RETURN_IF_ERR(hb_put(b, ":", 1));
            NIB_RETURN_IF_ERR(hb_str(b, w->meta[i].value));
        }
        NIB_RETURN_IF_ERR(hb_put(b, "}", 1));
    }
    uint64_t begin = 0;
    for (size_t i = 0; i < w->n_decls; i++) {
        if (i || w->n_meta) NIB_RETURN_IF_ERR(hb_put(b, ",", 1));
        NIB_RETURN_IF_ERR(hb_tensor(b, &w->decls[i], begin));
        begin += w->decls[i].nbytes;
    }
    NIB_RETURN_IF_ERR(hb_put(b, "}", 1));
    uint64_t padded;
    if (nib_pad_overflow_u64(ST_PREFIX_BYTES + (uint64_t)b->len, 8, &padded))
        return NIB_ERR(NIB_ERR_OVERFLOW, "safetensors writer: header size overflows");
    size_t pad = (size_t)(padded - ST_PREFIX_BYTES - b->len);
    NIB_RETURN_IF_ERR(hb_reserve(b, pad));
    memset(b->p + b->len, ' ', pad);
    b->len += pad;
    if (b->len > NIB_ST_MAX_HEADER_BYTES)
        return NIB_ERR(NIB_ERR_INVALID_ARG,
                       "safetensors writer: header of %zu bytes exceeds the format's limit of "
                       "%llu bytes",
                       b->len, (unsigned long long)NIB_ST_MAX_HEADER_BYTES);
    return NIB_OK;
}

static nib_status put_bytes(nib_st_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n)
        return NIB_ERR(NIB_ERR_IO, "safetensors writer: writing '%s' failed: %s", w->tmp_path,
                       strerror(errno));
    return NIB_OK;
}

static nib_status write_header(nib_st_writer *w) {
    nib_status st = NIB_OK;
    hbuf b = {0};
    unsigned char le[ST_PREFIX_BYTES];
    NIB_TRY(build_header(w, &b));
    for (int i = 0; i < ST_PREFIX_BYTES; i++) le[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    NIB_TRY(put_bytes(w, le, sizeof le));
    NIB_TRY(put_bytes(w, b.p, b.len));
    w->header_written = true;
fail:
    nib_free(b.p);
    return st;
}

nib_status nib_st_writer_write(nib_st_writer *w, const void *data, size_t n) {
    nib_status st = NIB_OK;
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: write on a NULL writer");
    if (w->failed)
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: write after a failed write");
    if (!data && n) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: NULL data");
    if (n > w->data_total - w->written) {
        st = NIB_ERR(NIB_ERR_INVALID_ARG,
                     "safetensors writer: writing %zu bytes to '%s' would pass the %llu declared "
                     "data bytes (%llu already written)",
                     n, w->path, (unsigned long long)w->data_total,
                     (unsigned long long)w->written);
        goto fail;
    }
    if (!w->header_written) NIB_TRY(write_header(w));
    NIB_TRY(put_bytes(w, data, n));
    w->written += n;
    return NIB_OK;
fail:
    w->failed = st;
    return st;
}

/* The declared tensor that contains data offset `at` (for "incomplete" messages). */
static const char *decl_at(const nib_st_writer *w, uint64_t at) {
    uint64_t end = 0;
    for (size_t i = 0; i < w->n_decls; i++) {
        end += w->decls[i].nbytes;
        if (at < end) return w->decls[i].name;
    }
    return "?";
}

static void writer_free(nib_st_writer *w) {
    for (size_t i = 0; i < w->n_decls; i++) nib_free(w->decls[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        nib_free(w->meta[i].key);
        nib_free(w->meta[i].value);
    }
    nib_free(w->decls);
    nib_free(w->meta);
    nib_free(w->name_set);
    nib_free(w->path);
    nib_free(w->tmp_path);
    nib_free(w);
}

void nib_st_writer_abort(nib_st_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp_created) remove(w->tmp_path);
    writer_free(w);
}

nib_status nib_st_writer_finish(nib_st_writer *w) {
    nib_status st = NIB_OK;
    char shown[ST_SHOW_NAME];
    if (!w) return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors writer: finish on a NULL writer");
    if (w->failed) {
        st = NIB_ERR(w->failed, "safetensors writer: '%s' not written: an earlier write failed",
                     w->path);
        goto fail;
    }
    if (w->written != w->data_total) {
        const char *name = decl_at(w, w->written);
        st = NIB_ERR(NIB_ERR_INVALID_ARG,
                     "safetensors writer: '%s' not written: only %llu of %llu declared data "
                     "bytes were written (tensor '%s' is incomplete)",
                     w->path, (unsigned long long)w->written, (unsigned long long)w->data_total,
                     show_name(shown, name, strlen(name)));
        goto fail;
    }
    if (!w->header_written) NIB_TRY(write_header(w)); /* a file with no data bytes */
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors writer: flushing '%s' failed: %s", w->tmp_path,
                     strerror(errno));
        goto fail;
    }
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors writer: closing '%s' failed: %s", w->tmp_path,
                     strerror(errno));
        goto fail;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        st = NIB_ERR(NIB_ERR_IO, "safetensors writer: renaming '%s' to '%s' failed: %s",
                     w->tmp_path, w->path, strerror(errno));
        goto fail;
    }
    writer_free(w);
    return NIB_OK;
fail:
    nib_st_writer_abort(w);
    return st;
}

nib_status nib_st_save(const char *path, size_t n, const nib_st_save_tensor *tensors,
                       size_t n_meta, const char *const *meta_kv) {
    nib_status st = NIB_OK;
    nib_st_writer *w = NULL;
    if ((n && !tensors) || (n_meta && !meta_kv))
        return NIB_ERR(NIB_ERR_INVALID_ARG, "safetensors save: NULL tensor or metadata array");
    NIB_TRY(nib_st_writer_create(path, &w));
    for (size_t i = 0; i < n_meta; i++)
        NIB_TRY(nib_st_writer_set_metadata(w, meta_kv[2 * i], meta_kv[2 * i + 1]));
    for (size_t i = 0; i < n; i++)
        NIB_TRY(nib_st_writer_declare(w, tensors[i].name, tensors[i].dtype, tensors[i].ndim,
                                      tensors[i].shape));
    for (size_t i = 0; i < n; i++) {
        uint64_t nbytes = w->decls[i].nbytes;
        if (nbytes > SIZE_MAX) {
            st = NIB_ERR(NIB_ERR_OVERFLOW, "safetensors save: tensor of %llu bytes",
                         (unsigned long long)nbytes);
            goto fail;
        }
        NIB_TRY(nib_st_writer_write(w, tensors[i].data, (size_t)nbytes));
    }
    st = nib_st_writer_finish(w);
    w = NULL;
    return st;
fail:
    nib_st_writer_abort(w);
    return st;
}
