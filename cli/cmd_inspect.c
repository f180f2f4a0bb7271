/* cmd_inspect.c — `nib inspect FILE [--json]`: validate a safetensors file completely and list
 * its tensors (file order), totals and metadata. Only the header is read: the file is mapped
 * lazily and tensor data pages are never touched. */
#include <string.h>

#include "cli/cli.h"
#include "io/json.h"
#include "io/safetensors.h"

#define NAME_COL_MAX 60 /* a longer name overflows its column instead of widening the table */

static void usage_error(void) {
    fprintf(stderr, "usage: nib inspect FILE [--json]   (nib inspect --help for details)\n");
}

static void print_help(void) {
    printf("usage: nib inspect FILE [--json]\n"
           "Validates a .safetensors file completely (length prefix, strict JSON header,\n"
           "dtypes, shapes, sizes, and that the tensors tile the data section exactly) and\n"
           "lists each tensor's name, dtype, shape and bytes in file order, then the totals\n"
           "(tensors, parameters, data, header and file bytes) and the __metadata__ entries.\n"
           "Tensor data is not read. Control characters in names are printed escaped.\n"
           "  --json   print one JSON object instead of the table\n"
           "Exit status: 0 valid file, 1 invalid or unreadable file, 2 usage error.\n");
}

/* Write s[0 .. n) with JSON string escaping, so no control character reaches the terminal,
 * to out (or nowhere if out is NULL); returns the terminal columns it takes: the code points
 * of the escaped text (wide characters are not accounted for). Chunks are cut before a UTF-8
 * continuation byte so no sequence is split. */
static size_t put_escaped(FILE *out, const char *s, size_t n) {
    enum { CHUNK = 256 };
    char buf[6 * CHUNK + 1]; /* escaping grows text at most 6x */
    size_t i = 0, cols = 0;
    while (i < n) {
        size_t end = n - i > CHUNK ? i + CHUNK : n;
        while (end < n && end > i + 1 && ((unsigned char)s[end] & 0xC0) == 0x80) end--;
        nib_json_escape(buf, sizeof buf, s + i, end - i);
        for (const char *c = buf; *c; c++) cols += ((unsigned char)*c & 0xC0) != 0x80;
        if (out) fputs(buf, out);
        i = end;
    }
    return cols;
}

/* "[2048, 1024]"; "[]" for a scalar. */
static const char *shape_str(const nib_st_tensor *t, char *buf, size_t cap) {
    size_t w = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->ndim && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (w < cap) snprintf(buf + w, cap - w, "]");
    return buf;
}

/* "4.19 MB" style (three significant digits, decimal prefixes); plain "<x> <unit>" below
 * 1000. unit is "" for counts. */
static const char *human(uint64_t x, const char *unit, char buf[32]) {
    static const char *const prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
    double v = (double)x;
    size_t p = 0;
    while (v >= 1000.0 && p + 1 < NIB_ARRAY_LEN(prefixes)) {
        v /= 1000.0;
        p++;
    }
    if (p == 0) snprintf(buf, 32, "%llu%s%s", (unsigned long long)x, *unit ? " " : "", unit);
    else snprintf(buf, 32, "%.*f %s%s", v < 10 ? 2 : v < 100 ? 1 : 0, v, prefixes[p], unit);
    return buf;
}

/* Tensors tile the data section, and numel <= nbytes, so the sum cannot overflow. */
static uint64_t total_params(const nib_st_file *f) {
    uint64_t p = 0;
    for (size_t i = 0; i < nib_st_count(f); i++) p += nib_st_tensor_at(f, i)->numel;
    return p;
}

static void print_text(const char *path, const nib_st_file *f) {
    char shape[256], h1[32], h2[32];
    size_t name_w = 4, shape_w = 5;
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        size_t w = put_escaped(NULL, t->name, t->name_len);
        size_t s = strlen(shape_str(t, shape, sizeof shape));
        if (w > name_w) name_w = w > NAME_COL_MAX ? NAME_COL_MAX : w;
        if (s > shape_w) shape_w = s;
    }
    printf("%s\n\n", path);
    printf("  %-*s  %-8s  %-*s  %s\n", (int)name_w, "NAME", "DTYPE", (int)shape_w, "SHAPE",
           "BYTES");
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        printf("  ");
        size_t w = put_escaped(stdout, t->name, t->name_len);
        printf("%*s  %-8s  %-*s  %llu\n", (int)(w < name_w ? name_w - w : 0), "",
               nib_dtype_name(t->dtype), (int)shape_w, shape_str(t, shape, sizeof shape),
               (unsigned long long)t->nbytes);
    }
    uint64_t params = total_params(f), data = nib_st_data_size(f);
    printf("\n  tensors     %zu\n", nib_st_count(f));
    printf("  parameters  %llu (%s)\n", (unsigned long long)params, human(params, "", h1));
    printf("  data        %llu bytes (%s)\n", (unsigned long long)data, human(data, "B", h2));
    printf("  header      %llu bytes\n", (unsigned long long)nib_st_header_size(f));
    printf("  file        %llu bytes\n", (unsigned long long)nib_st_file_size(f));
    if (nib_st_metadata_count(f) == 0) return;
    printf("\n  metadata (%zu)\n", nib_st_metadata_count(f));
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        printf("    ");
        put_escaped(stdout, kv->key, kv->key_len);
        printf(": ");
        put_escaped(stdout, kv->value, kv->value_len);
        printf("\n");
    }
}

static void put_json_string(const char *s, size_t n) {
    putchar('"');
    put_escaped(stdout, s, n);
    putchar('"');
}

static void print_json(const char *path, const nib_st_file *f) {
    printf("{\"file\": ");
    put_json_string(path, strlen(path));
    printf(", \"file_bytes\": %llu, \"header_bytes\": %llu, \"data_bytes\": %llu, "
           "\"tensor_count\": %zu, \"parameters\": %llu,\n \"tensors\": [",
           (unsigned long long)nib_st_file_size(f), (unsigned long long)nib_st_header_size(f),
           (unsigned long long)nib_st_data_size(f), nib_st_count(f),
           (unsigned long long)total_params(f));
    for (size_t i = 0; i < nib_st_count(f); i++) {
        const nib_st_tensor *t = nib_st_tensor_at(f, i);
        printf("%s\n  {\"name\": ", i ? "," : "");
        put_json_string(t->name, t->name_len);
        printf(", \"dtype\": \"%s\", \"shape\": [", nib_dtype_name(t->dtype));
        for (int32_t d = 0; d < t->ndim; d++)
            printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        printf("], \"data_offsets\": [%llu, %llu], \"bytes\": %llu}", (unsigned long long)t->begin,
               (unsigned long long)t->end, (unsigned long long)t->nbytes);
    }
    printf("],\n \"metadata\": {");
    for (size_t i = 0; i < nib_st_metadata_count(f); i++) {
        const nib_st_kv *kv = nib_st_metadata_at(f, i);
        printf("%s", i ? ", " : "");
        put_json_string(kv->key, kv->key_len);
        printf(": ");
        put_json_string(kv->value, kv->value_len);
    }
    printf("}}\n");
}

int nib_cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (nib_cli_is_help(argv[i])) {
            print_help();
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "nib inspect: unknown option '%s'\n", argv[i]);
            usage_error();
            return 2;
        } else if (path) {
            fprintf(stderr, "nib inspect: expected one FILE, got '%s' and '%s'\n", path, argv[i]);
            usage_error();
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage_error();
        return 2;
    }
    nib_st_file *f = NULL;
    nib_status st = nib_st_open(path, &f);
    if (st != NIB_OK) return nib_cli_fail("inspect", st);
    if (json) print_json(path, f);
    else print_text(path, f);
    nib_st_close(f);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "nib inspect: writing the listing failed\n");
        return 1;
    }
    return 0;
}
