/* json.h — a small strict JSON (RFC 8259) parser into a read-only tree, plus string escaping.
 *
 * Used for safetensors headers and model configs, i.e. on untrusted bytes. Strict means:
 *   - exactly the RFC 8259 grammar: no comments, trailing commas, NaN/Infinity, single quotes,
 *     leading zeros ("01"), leading '+', bare '.5'/'1.'; whitespace is only space/tab/CR/LF;
 *     nothing but whitespace after the top-level value; an empty document is an error;
 *   - strings are valid UTF-8 (no overlong forms, no encoded surrogates, nothing above
 *     U+10FFFF, no truncated sequences), contain no raw control character < 0x20, and use only
 *     the escapes \" \\ \/ \b \f \n \r \t \uXXXX, with \u surrogates correctly paired;
 *   - no duplicate keys within an object (compared after unescaping);
 *   - containers nest at most NIB_JSON_MAX_DEPTH deep;
 *   - a number whose magnitude overflows a double (1e400) is rejected.
 * Every error is NIB_ERR_FORMAT with a message "json: <what> at byte N", where N is the offset
 * of the offending byte plus the caller's base_offset (safetensors passes 8, so N is a file
 * offset).
 *
 * Memory: one arena per document, freed by nib_json_free. Parsing allocates O(len): a value
 * costs about 40 bytes in the tree plus 64 bytes of scratch while its container is open, and
 * takes at least 2 input bytes, so the worst case (a flat array of one-digit numbers) peaks at
 * about 55 bytes per input byte; typical documents (keys, longer strings) need far less. The
 * tree does not point into the input; the input may be freed after parsing.
 *
 * Accessors take NULL (an absent value) and answer "absent" / 0 / NULL, so lookups chain:
 *   const nib_json_value *d = nib_json_get(nib_json_get(root, "text_config"), "hidden_size");
 */
#ifndef NIB_IO_JSON_H
#define NIB_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NIB_JSON_MAX_DEPTH 64

typedef enum nib_json_type {
    NIB_JSON_NONE = 0, /* absent: the accessor was given NULL (e.g. a missing key) */
    NIB_JSON_NULL,
    NIB_JSON_BOOL,
    NIB_JSON_NUMBER,
    NIB_JSON_STRING,
    NIB_JSON_ARRAY,
    NIB_JSON_OBJECT
} nib_json_type;

typedef struct nib_json_doc nib_json_doc;     /* owns every value and string of one parse */
typedef struct nib_json_value nib_json_value; /* opaque, read-only, lives as long as its doc */

/* One object member, in document order. */
typedef struct nib_json_member {
    const char *key;       /* decoded UTF-8, NUL-terminated; may hold NUL (\u0000): see key_len */
    size_t key_len;
    uint64_t key_offset;   /* base_offset + offset of the key's opening quote */
    const nib_json_value *value;
} nib_json_member;

/* Parse text[0 .. len) (need not be NUL-terminated). base_offset is added to every offset in
 * messages and in nib_json_offset. Errors: NIB_ERR_FORMAT (invalid JSON; message has the byte
 * offset), NIB_ERR_OUT_OF_MEMORY, NIB_ERR_INVALID_ARG (NULL out, or NULL text with len > 0). */
nib_status nib_json_parse(const char *text, size_t len, uint64_t base_offset,
                          nib_json_doc **out);
/* NULL is a no-op. */
void nib_json_free(nib_json_doc *doc);
const nib_json_value *nib_json_root(const nib_json_doc *doc);

nib_json_type nib_json_type_of(const nib_json_value *v);
/* "absent", "null", "bool", "number", "string", "array", "object". */
const char *nib_json_type_name(nib_json_type t);
/* base_offset + offset of the value's first byte; 0 for NULL. */
uint64_t nib_json_offset(const nib_json_value *v);

/* Members of an object or elements of an array; 0 for anything else. */
size_t nib_json_count(const nib_json_value *v);
/* Element i of an array; NULL if v is not an array or i is out of range. */
const nib_json_value *nib_json_elem(const nib_json_value *arr, size_t i);
/* Member i of an object in document order; NULL if v is not an object or i is out of range. */
const nib_json_member *nib_json_member_at(const nib_json_value *obj, size_t i);
/* Value of the member with this key (O(log n)); NULL if absent or obj is not an object. */
const nib_json_value *nib_json_getn(const nib_json_value *obj, const char *key, size_t key_len);
const nib_json_value *nib_json_get(const nib_json_value *obj, const char *key);

/* true only for the literal true. */
bool nib_json_bool(const nib_json_value *v);
/* Decoded UTF-8 of a string (NUL-terminated, *len excludes the NUL and counts embedded NULs);
 * NULL if v is not a string. len may be NULL. */
const char *nib_json_string(const nib_json_value *v, size_t *len);
/* Numbers: the text as written (NUL-terminated) and its value as a double (nearest, finite).
 * NULL / NaN if v is not a number. */
const char *nib_json_number_text(const nib_json_value *v, size_t *len);
double nib_json_double(const nib_json_value *v);
/* The exact integer a number denotes. NIB_ERR_FORMAT when v is not a number, is written with
 * a fraction or exponent ("1.0", "1e3"), is "-0" (float output, not an integer count), or does
 * not fit in int64. The message names the text and its byte offset. */
nib_status nib_json_int64(const nib_json_value *v, int64_t *out);

/* ---- strings ------------------------------------------------------------------------------ */
/* true if s[0 .. n) is valid UTF-8 (same rules as the parser); else *bad_at (if non-NULL) is
 * the offset of the first byte of the first invalid sequence. */
bool nib_json_utf8_valid(const char *s, size_t n, size_t *bad_at);
/* Write s[0 .. n) as the inside of a JSON string literal (no quotes) into dst, snprintf-style:
 * returns the length of the full escaped text; writes at most cap - 1 bytes plus a NUL (cap
 * may be 0, dst may then be NULL); never splits an escape or a UTF-8 sequence. Escaped: '"',
 * '\\', every C0 control, DEL and the C1 controls U+0080..U+009F, so the result is both valid
 * JSON and safe to print on a terminal. Invalid UTF-8 bytes become \ufffd. The escaped text
 * is at most 6 * n bytes. */
size_t nib_json_escape(char *dst, size_t cap, const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* NIB_IO_JSON_H */
