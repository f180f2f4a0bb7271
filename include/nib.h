/* nib.h — public C API of nib.
 *
 * nib runs transformer policies (Pi0.5) and Gemma-style decoders at batch 1 with 4- and 8-bit
 * weights. This header is plain C (C11) and stable: opaque handles, status codes, no structs
 * whose layout callers depend on except nib_tensor_desc.
 *
 * Error model: every fallible function returns nib_status. NIB_OK is 0. On failure, the
 * calling thread's nib_last_error() holds a message naming what failed and where
 * ("safetensors: tensor 'w' data_offsets [0, 12] exceed data section of 8 bytes (byte 140)").
 * The library never exits, aborts or prints except through the logger (NIB_LOG).
 */
#ifndef NIB_H
#define NIB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NIB_VERSION_MAJOR 0
#define NIB_VERSION_MINOR 1
#define NIB_VERSION_PATCH 0

/* ---- status codes ----------------------------------------------------------------------- */
typedef enum nib_status {
    NIB_OK = 0,
    NIB_ERR_INVALID_ARG = 1,      /* a caller passed a bad value (NULL, negative size, bad enum) */
    NIB_ERR_OUT_OF_MEMORY = 2,    /* host allocation failed */
    NIB_ERR_OVERFLOW = 3,         /* size/offset arithmetic would overflow */
    NIB_ERR_IO = 4,               /* open/read/write/mmap failed (errno text in the message) */
    NIB_ERR_FORMAT = 5,           /* malformed file or header: names the field and byte offset */
    NIB_ERR_NOT_FOUND = 6,        /* a named tensor, key or command does not exist */
    NIB_ERR_SHAPE = 7,            /* shapes or dtypes do not match what the operation needs */
    NIB_ERR_UNSUPPORTED = 8,      /* valid request this build or format does not implement */
    NIB_ERR_NO_DEVICE = 9,        /* no CUDA device or driver, or a CPU-only build */
    NIB_ERR_UNSUPPORTED_DEVICE = 10, /* device present but its compute capability is too old */
    NIB_ERR_DEVICE_OOM = 11,      /* device allocation failed: message has bytes asked and free */
    NIB_ERR_DEVICE_LOST = 12,     /* sticky CUDA error: the context is unusable; op and file:line */
    NIB_ERR_CUDA = 13,            /* any other (non-sticky) CUDA / cuBLAS error */
    NIB_ERR_NUMERICS = 14,        /* NaN/Inf found by a numerics check */
    NIB_ERR_INTERNAL = 15         /* a bug in nib: please report the message */
} nib_status;

/* Short constant name of a status ("NIB_ERR_FORMAT"); never NULL. */
const char *nib_status_name(nib_status s);
/* The calling thread's last error message ("" if none). Valid until the next nib call. */
const char *nib_last_error(void);
/* Clear the calling thread's last error. */
void nib_clear_error(void);
/* "0.1.0" */
const char *nib_version(void);

/* ---- logging ---------------------------------------------------------------------------- */
/* Level from the environment variable NIB_LOG: error|warn|info|debug|trace (default warn).
 * Log lines go to stderr as "nib <level>: message". */
typedef enum nib_log_level {
    NIB_LOG_ERROR = 0,
    NIB_LOG_WARN = 1,
    NIB_LOG_INFO = 2,
    NIB_LOG_DEBUG = 3,
    NIB_LOG_TRACE = 4
} nib_log_level;
void nib_log_set_level(nib_log_level level);
nib_log_level nib_log_get_level(void);

/* ---- element types ---------------------------------------------------------------------- */
/* Storage element types. Names match safetensors where safetensors has them. */
typedef enum nib_dtype {
    NIB_DTYPE_INVALID = 0,
    NIB_DTYPE_BOOL,
    NIB_DTYPE_U8,
    NIB_DTYPE_I8,
    NIB_DTYPE_U16,
    NIB_DTYPE_I16,
    NIB_DTYPE_U32,
    NIB_DTYPE_I32,
    NIB_DTYPE_U64,
    NIB_DTYPE_I64,
    NIB_DTYPE_F16,
    NIB_DTYPE_BF16,
    NIB_DTYPE_F32,
    NIB_DTYPE_F64,
    NIB_DTYPE_F8_E4M3,  /* e4m3fn: no Inf, NaN = 0x7F/0xFF, max 448 */
    NIB_DTYPE_F8_E5M2,
    NIB_DTYPE_F8_E8M0,  /* exponent-only scale, bias 127, 0xFF = NaN */
    NIB_DTYPE_COUNT
} nib_dtype;

/* Bytes per element (1 for the FP8 types); 0 for NIB_DTYPE_INVALID or out of range. */
size_t nib_dtype_size(nib_dtype dt);
/* "BF16", "F8_E4M3" ... (the safetensors spelling); "INVALID" otherwise. */
const char *nib_dtype_name(nib_dtype dt);
/* Parse the safetensors spelling; NIB_DTYPE_INVALID when unknown. n = length of s. */
nib_dtype nib_dtype_from_name(const char *s, size_t n);

/* ---- tensor descriptor ------------------------------------------------------------------ */
#define NIB_MAX_DIMS 8
/* Shape and strides in elements, outermost first. nbytes = bytes spanned by the tensor
 * (for a contiguous tensor: product(shape) * dtype size). All fields are computed with
 * overflow checks by nib_tensor_desc_init / nib_tensor_desc_init_strided. */
typedef struct nib_tensor_desc {
    nib_dtype dtype;
    int32_t ndim;                     /* 0 (scalar) .. NIB_MAX_DIMS */
    int64_t shape[NIB_MAX_DIMS];
    int64_t strides[NIB_MAX_DIMS];   /* elements */
    uint64_t numel;
    uint64_t nbytes;
} nib_tensor_desc;

/* Contiguous (row-major) descriptor. Errors: NIB_ERR_INVALID_ARG (bad dtype, ndim, negative
 * dim), NIB_ERR_OVERFLOW (element or byte count does not fit in 63 bits). */
nib_status nib_tensor_desc_init(nib_tensor_desc *d, nib_dtype dt, int32_t ndim,
                                const int64_t *shape);
/* Strided descriptor (non-negative strides). nbytes covers the highest addressed element. */
nib_status nib_tensor_desc_init_strided(nib_tensor_desc *d, nib_dtype dt, int32_t ndim,
                                        const int64_t *shape, const int64_t *strides);
/* 1 if row-major contiguous. */
int nib_tensor_desc_is_contiguous(const nib_tensor_desc *d);

/* ---- Pi0.5 policy ------------------------------------------------------------------------ */
/* A loaded Pi0.5 (its checkpoint stays mapped while the policy is open), for a control loop:
 * open once, call nib_pi05_policy_run every tick. One call at a time per policy (calls from
 * several threads must be serialized by the caller); several policies may be open at once.
 * The first call of each call shape (cameras used, text length, horizon, image dtype) captures
 * a CUDA graph; later calls of that shape replay it. python/nib.py wraps this for Python. */
typedef struct nib_pi05_policy nib_pi05_policy;

/* checkpoint: an openpi-converted model.safetensors (or one written by `nib quantize --pi05`).
 * preset: "fast", "bf16" (GPU) or "ref" (fp32 CPU reference). overrides: NULL or
 * "vision=fp8,prefix=bf16,expert=int4,kv=fp8" (as `nib run --precision`). max_horizon: the
 * largest horizon the calls will ask for (0: the checkpoint's). Errors name the file, tensor or
 * option: NIB_ERR_IO / FORMAT / NOT_FOUND / SHAPE (checkpoint), INVALID_ARG (preset, overrides),
 * NO_DEVICE / UNSUPPORTED_DEVICE / DEVICE_OOM (GPU presets). */
nib_status nib_pi05_policy_open(const char *checkpoint, const char *preset, const char *overrides,
                                int32_t max_horizon, nib_pi05_policy **out);
/* Closes the policy (NULL: no-op). */
void nib_pi05_policy_close(nib_pi05_policy *p);

typedef enum nib_pi05_size {
    NIB_PI05_MAX_CAMERAS = 0, /* images per call (V) */
    NIB_PI05_IMAGE_SIZE = 1,  /* image height = width (224) */
    NIB_PI05_MAX_TEXT = 2,    /* text tokens per call */
    NIB_PI05_MAX_HORIZON = 3, /* action steps per call (H) */
    NIB_PI05_ACTION_DIM = 4,  /* values per action step (32) */
    NIB_PI05_VOCAB = 5,       /* token ids are < this */
    NIB_PI05_STEPS = 6        /* flow-matching steps per call */
} nib_pi05_size;
/* One of the policy's sizes, or -1 for a NULL policy or an unknown `what`. */
int64_t nib_pi05_policy_size(const nib_pi05_policy *p, nib_pi05_size what);

/* One policy call. images: n_cameras images, either images_f32 [V][3][S][S] in [-1, 1] (openpi's
 * PyTorch layout) or images_u8 [V][S][S][3] camera frames (u8 / 255 * 2 - 1; a quarter of the
 * bytes to check and copy); exactly one of the two. image_mask: NULL (all valid) or [V] of 0/1
 * (masked cameras are skipped exactly). text_ids: [n_text] token ids. noise: NULL (N(0, 1) from
 * seed) or [horizon][action_dim]. actions: [horizon][action_dim] floats, written on success.
 * The caller's buffers are read during the call only. Errors: INVALID_ARG / SHAPE naming the
 * input (an id outside the vocabulary, too many cameras, a horizon above max_horizon),
 * NUMERICS naming the element (NaN / Inf in images or noise), device errors as above. */
nib_status nib_pi05_policy_run(nib_pi05_policy *p, int32_t n_cameras, const float *images_f32,
                               const uint8_t *images_u8, const uint8_t *image_mask,
                               const int32_t *text_ids, int32_t n_text, int32_t horizon,
                               const float *noise, uint64_t seed, float *actions);

#ifdef __cplusplus
}
#endif
#endif /* NIB_H */
