/* safetensors.h — validated zero-copy reader and streaming writer for .safetensors files.
 *
 * File layout: [u64 little-endian N][N bytes of JSON header][data section]. The header maps
 * tensor names to {"dtype", "shape", "data_offsets": [BEGIN, END]} (offsets relative to the
 * data section, END exclusive) plus an optional "__metadata__" string->string map.
 *
 * The reader validates everything before nib_st_open returns, and rejects (NIB_ERR_FORMAT, or
 * NIB_ERR_OVERFLOW where arithmetic would overflow) with a message naming the field, the
 * tensor where one is involved, and the file byte offset:
 *   - a file shorter than 8 bytes; N > 100,000,000; 8 + N overflowing or past the end;
 *   - a header that does not begin with '{', is not strict JSON (io/json.h: duplicate keys,
 *     bad UTF-8, ... are errors), or is padded with anything but spaces (0x20);
 *   - a tensor entry that is not an object with exactly the keys dtype, shape, data_offsets;
 *     an unknown dtype; a shape that is not an array of at most NIB_MAX_DIMS non-negative
 *     integers; data_offsets that are not two non-negative integers with BEGIN <= END;
 *   - product(shape) * dtype size overflowing, or differing from END - BEGIN;
 *   - END beyond the data section; tensors that, sorted by offset, do not tile the data
 *     section exactly (first at 0, no holes, no overlaps, no trailing bytes);
 *   - an empty tensor name or a name containing NUL (stricter than the spec: C callers compare
 *     names as C strings, so "a\u0000x" would alias "a");
 *   - "__metadata__" that is not an object of strings, or a metadata key containing NUL.
 * Integers are written as plain JSON integers: "1.0", "1e3" and "-0" are rejected.
 * A file with no tensors ("{}" and no data) is valid. Memory used while opening is O(header
 * size); tensor data is never read (the mapping is lazy). Tensor data pointers point into the
 * mapping: they are not aligned beyond 1 byte in general (the writer aligns the data section
 * to 8; tensors themselves are packed back to back).
 * Out of scope, as in the reference implementation: a file changed while it is mapped.
 *
 * The writer streams: declare every tensor (in file order), optionally set metadata, then
 * append data bytes in any chunking; the header is written before the first data byte. Bytes go
 * to "<path>.tmp", which finish renames onto path only after every declared byte was written
 * and flushed; on any failure or abort the temporary file is removed and path is untouched.
 */
#ifndef NIB_IO_SAFETENSORS_H
#define NIB_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header the reader accepts and the writer produces (as in the reference reader). */
#define NIB_ST_MAX_HEADER_BYTES UINT64_C(100000000)

typedef struct nib_st_file nib_st_file;

typedef struct nib_st_tensor {
    const char *name;       /* NUL-terminated copy owned by the file; non-empty, UTF-8 */
    size_t name_len;
    nib_dtype dtype;
    int32_t ndim;           /* 0 (scalar) .. NIB_MAX_DIMS */
    int64_t shape[NIB_MAX_DIMS];
    uint64_t numel;         /* product(shape) */
    uint64_t begin, end;    /* data_offsets: relative to the data section, end exclusive */
    uint64_t nbytes;        /* end - begin = numel * dtype size */
    uint64_t file_offset;   /* 8 + N + begin: absolute offset of the first data byte */
    uint64_t entry_offset;  /* file offset of the tensor's name in the header (for messages) */
    const void *data;       /* into the mapping / caller buffer; valid until nib_st_close */
} nib_st_tensor;

typedef struct nib_st_kv {
    const char *key;        /* NUL-terminated; contains no NUL */
    size_t key_len;
    const char *value;      /* NUL-terminated; may contain NUL (\u0000): use value_len */
    size_t value_len;
} nib_st_kv;

/* Map `path` read-only and validate it. Errors: NIB_ERR_IO (open/stat/mmap, with strerror and
 * the path), NIB_ERR_FORMAT, NIB_ERR_OVERFLOW, NIB_ERR_OUT_OF_MEMORY, NIB_ERR_INVALID_ARG.
 * Messages of content errors are prefixed with the path. */
nib_status nib_st_open(const char *path, nib_st_file **out);
/* Same over buf[0 .. len), which is not copied and must outlive the returned file. */
nib_status nib_st_open_memory(const void *buf, size_t len, nib_st_file **out);
/* NULL is a no-op. Unmaps the file; every pointer obtained from f becomes invalid. */
void nib_st_close(nib_st_file *f);

/* Tensors, ordered by data offset (file order); index i < nib_st_count. */
size_t nib_st_count(const nib_st_file *f);
const nib_st_tensor *nib_st_tensor_at(const nib_st_file *f, size_t i);
/* Tensor by exact name (O(log n)); NULL if absent. */
const nib_st_tensor *nib_st_find(const nib_st_file *f, const char *name);

/* "__metadata__" entries in header order; lookup is linear (metadata maps are small). */
size_t nib_st_metadata_count(const nib_st_file *f);
const nib_st_kv *nib_st_metadata_at(const nib_st_file *f, size_t i);
/* Value for key, or NULL if absent. */
const nib_st_kv *nib_st_metadata_find(const nib_st_file *f, const char *key);

const void *nib_st_data(const nib_st_file *f);  /* first byte of the data section */
uint64_t nib_st_data_size(const nib_st_file *f);
uint64_t nib_st_header_size(const nib_st_file *f); /* N, padding included */
uint64_t nib_st_file_size(const nib_st_file *f);

/* ---- writer ------------------------------------------------------------------------------- */
typedef struct nib_st_writer nib_st_writer;

/* Create "<path>.tmp" for writing. Errors: NIB_ERR_IO, NIB_ERR_INVALID_ARG. */
nib_status nib_st_writer_create(const char *path, nib_st_writer **out);
/* Declare the next tensor of the file; data is written in declaration order. Errors
 * (NIB_ERR_INVALID_ARG unless noted; the writer stays usable): after the first write, empty
 * or invalid UTF-8 name, "__metadata__", a name declared twice, bad dtype/ndim/shape,
 * NIB_ERR_OVERFLOW when the byte count overflows. */
nib_status nib_st_writer_declare(nib_st_writer *w, const char *name, nib_dtype dt,
                                 int32_t ndim, const int64_t *shape);
/* Set (or replace) a "__metadata__" entry; UTF-8 key and value; before the first write. */
nib_status nib_st_writer_set_metadata(nib_st_writer *w, const char *key, const char *value);
/* Append n data bytes (the header goes out first, on the first call). Writing past the
 * declared total is NIB_ERR_INVALID_ARG; an OS failure is NIB_ERR_IO. Any error here is
 * sticky: later calls fail, and finish removes the temporary file. */
nib_status nib_st_writer_write(nib_st_writer *w, const void *data, size_t n);
/* Check that exactly the declared bytes were written (NIB_ERR_INVALID_ARG otherwise), write
 * the header if no data was, flush, fsync, close and rename onto path. Frees w in every case;
 * on failure nothing is left at path (a file already there is untouched) nor at path.tmp. */
nib_status nib_st_writer_finish(nib_st_writer *w);
/* Discard: close and remove the temporary file, free w. NULL is a no-op. */
void nib_st_writer_abort(nib_st_writer *w);

/* One tensor for nib_st_save; data holds product(shape) * dtype size bytes. */
typedef struct nib_st_save_tensor {
    const char *name;
    nib_dtype dtype;
    int32_t ndim;
    int64_t shape[NIB_MAX_DIMS];
    const void *data;
} nib_st_save_tensor;

/* Write a whole file through the writer. meta_kv holds n_meta (key, value) pairs as
 * 2 * n_meta strings: key0, value0, key1, value1, ... */
nib_status nib_st_save(const char *path, size_t n, const nib_st_save_tensor *tensors,
                       size_t n_meta, const char *const *meta_kv);

#ifdef __cplusplus
}
#endif
#endif /* NIB_IO_SAFETENSORS_H */
