/* error.c — thread-local last-error message, status names, version. */
#include <stdio.h>
#include <string.h>

#include "base.h"

#define NIB_ERRMSG_CAP 1024

static _Thread_local char g_msg[NIB_ERRMSG_CAP];

static const char *const k_status_names[] = {
    [NIB_OK] = "NIB_OK",
    [NIB_ERR_INVALID_ARG] = "NIB_ERR_INVALID_ARG",
    [NIB_ERR_OUT_OF_MEMORY] = "NIB_ERR_OUT_OF_MEMORY",
    [NIB_ERR_OVERFLOW] = "NIB_ERR_OVERFLOW",
    [NIB_ERR_IO] = "NIB_ERR_IO",
    [NIB_ERR_FORMAT] = "NIB_ERR_FORMAT",
    [NIB_ERR_NOT_FOUND] = "NIB_ERR_NOT_FOUND",
    [NIB_ERR_SHAPE] = "NIB_ERR_SHAPE",
    [NIB_ERR_UNSUPPORTED] = "NIB_ERR_UNSUPPORTED",
    [NIB_ERR_NO_DEVICE] = "NIB_ERR_NO_DEVICE",
    [NIB_ERR_UNSUPPORTED_DEVICE] = "NIB_ERR_UNSUPPORTED_DEVICE",
    [NIB_ERR_DEVICE_OOM] = "NIB_ERR_DEVICE_OOM",
    [NIB_ERR_DEVICE_LOST] = "NIB_ERR_DEVICE_LOST",
    [NIB_ERR_CUDA] = "NIB_ERR_CUDA",
    [NIB_ERR_NUMERICS] = "NIB_ERR_NUMERICS",
    [NIB_ERR_INTERNAL] = "NIB_ERR_INTERNAL",
};

const char *nib_status_name(nib_status s) {
    if ((unsigned)s < NIB_ARRAY_LEN(k_status_names) && k_status_names[s])
        return k_status_names[s];
    return "NIB_ERR_UNKNOWN";
}

const char *nib_last_error(void) { return g_msg; }

void nib_clear_error(void) { g_msg[0] = '\0'; }

const char *nib_version(void) { return "0.1.0"; }

nib_status nib_set_errorv(nib_status st, const char *file, int line, const char *fmt,
                          va_list ap) {
    int n = vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof g_msg && file) {
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        snprintf(g_msg + n, sizeof g_msg - (size_t)n, " [%s:%d]", base, line);
    }
    nib_log(NIB_LOG_DEBUG, "%s: %s", nib_status_name(st), g_msg);
    return st;
}

nib_status nib_set_error(nib_status st, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nib_set_errorv(st, file, line, fmt, ap);
    va_end(ap);
    return st;
}

nib_status nib_error_context(nib_status st, const char *fmt, ...) {
    char prefix[512];
    char old[NIB_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    old[sizeof old - 1] = '\0';
    snprintf(g_msg, sizeof g_msg, "%s: %s", prefix, old);
    return st;
}
