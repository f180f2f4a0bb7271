/* log.c — leveled logging to stderr, level from NIB_LOG (error|warn|info|debug|trace). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static int g_level = -1; /* -1: not read from the environment yet */

static int level_from_env(void) {
    const char *s = getenv("NIB_LOG");
    if (!s || !*s) return NIB_LOG_WARN;
    if (!strcmp(s, "error")) return NIB_LOG_ERROR;
    if (!strcmp(s, "warn")) return NIB_LOG_WARN;
    if (!strcmp(s, "info")) return NIB_LOG_INFO;
    if (!strcmp(s, "debug")) return NIB_LOG_DEBUG;
    if (!strcmp(s, "trace")) return NIB_LOG_TRACE;
    if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') return s[0] - '0';
    fprintf(stderr, "nib warn: NIB_LOG='%s' is not one of error|warn|info|debug|trace; using warn\n",
            s);
    return NIB_LOG_WARN;
}

nib_log_level nib_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (nib_log_level)g_level;
}

void nib_log_set_level(nib_log_level level) {
    if ((int)level < NIB_LOG_ERROR) level = NIB_LOG_ERROR;
    if ((int)level > NIB_LOG_TRACE) level = NIB_LOG_TRACE;
    g_level = (int)level;
}

void nib_log(nib_log_level lvl, const char *fmt, ...) {
    static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
    if ((int)lvl > (int)nib_log_get_level()) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nib %s: %s\n", names[lvl], buf);
}
