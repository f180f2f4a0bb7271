/* harness.c — test runner: `nib_tests [substring]`, `nib_tests -l` lists names. */
#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "runtime/device.h"

#define MAX_TESTS 4096

typedef struct test_entry {
    const char *name;
    const char *file;
    nib_test_fn fn;
} test_entry;
static test_entry g_tests[MAX_TESTS];
static int g_ntests;

void nib_test_register(const char *name, const char *file, nib_test_fn fn) {
    if (g_ntests >= MAX_TESTS) {
        fprintf(stderr, "harness: more than %d tests\n", MAX_TESTS);
        exit(2);
    }
    g_tests[g_ntests].name = name;
    g_tests[g_ntests].file = file;
    g_tests[g_ntests].fn = fn;
    g_ntests++;
}

void nib_test_fail(nib_test_ctx *t, const char *file, int line, const char *fmt, ...) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (t->failures < 20) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        printf("  FAIL %s:%d: %s\n", base, line, msg);
    } else if (t->failures == 20) {
        printf("  (further failures of %s not shown)\n", t->name);
    }
    t->failures++;
}

void nib_test_skip(nib_test_ctx *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->skip_reason, sizeof t->skip_reason, fmt, ap);
    va_end(ap);
    t->skipped = 1;
}

int nib_test_have_gpu(void) {
    static int cached = -1;
    if (cached < 0) cached = nib_device_available() ? 1 : 0;
    return cached;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void nib_test_rng(nib_test_ctx *t, nib_rng *r) { nib_rng_seed(r, t->seed ^ fnv1a(t->name)); }

const char *nib_test_tmpdir(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        if (!base || !*base) base = "/tmp";
        snprintf(dir, sizeof dir, "%s/nib-tests-%d", base, (int)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

extern char **environ;

int nib_test_run_self(const char *filter, const char *const *env, char *out, size_t cap) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    /* the environment is built here, before the child exists (nothing but exec runs in it) */
    size_t ne = 0, nx = 0;
    while (environ[ne]) ne++;
    while (env && env[nx]) nx++;
    char **envp = calloc(ne + nx + 1, sizeof *envp);
    if (!envp) return -1;
    for (size_t i = 0; i < nx; i++) envp[i] = (char *)env[i];
    size_t k = nx;
    for (size_t i = 0; i < ne; i++) { /* inherited, unless overridden above */
        const char *eq = strchr(environ[i], '=');
        size_t len = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
        int dup = 0;
        for (size_t j = 0; j < nx && !dup; j++) dup = !strncmp(env[j], environ[i], len);
        if (!dup) envp[k++] = environ[i];
    }
    envp[k] = NULL;
    int fd[2];
    if (pipe(fd)) {
        free(envp);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 2);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    char *argv[3] = {exe, (char *)filter, NULL};
    pid_t pid;
    fflush(stdout);
    int rc = posix_spawn(&pid, exe, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    close(fd[1]);
    if (rc) {
        close(fd[0]);
        return -1;
    }
    size_t got = 0;
    char buf[4096];
    ssize_t r;
    while ((r = read(fd[0], buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        for (ssize_t i = 0; i < r && out && got + 1 < cap; i++) out[got++] = buf[i];
    }
    if (out && cap) out[got] = '\0';
    close(fd[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

static int cmp_tests(const void *a, const void *b) {
    const test_entry *ta = a, *tb = b;
    int c = strcmp(ta->file, tb->file);
    if (c) return c;
    return strcmp(ta->name, tb->name);
}

int nib_test_name_matches(const char *name, const char *filter) {
    if (!filter || !*filter) return 1;
    for (const char *p = filter;;) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n) {
            for (const char *q = name; strlen(q) >= n; q++)
                if (!strncmp(q, p, n)) return 1;
        }
        if (!e) return 0;
        p = e + 1;
    }
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    int list = 0, shard = 0, nshards = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-l") || !strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: nib_tests [-l] [--shard I/N] [SUBSTRING[,SUBSTRING...]]\n"
                   "Runs every registered test whose name contains one of the SUBSTRINGs (all tests\n"
                   "without one). --shard I/N keeps the I-th of N round-robin shards (0 <= I < N) of\n"
                   "the selected tests, in name order, so long runs (compute-sanitizer) can be split.\n"
                   "NIB_TEST_SEED=N changes the random inputs (default 1).\n");
            return 0;
        } else if (!strcmp(argv[i], "--shard")) {
            char *end = NULL;
            if (i + 1 < argc) shard = (int)strtol(argv[i + 1], &end, 10);
            if (!end || *end != '/' || (nshards = (int)strtol(end + 1, &end, 10)) < 1 || *end || shard < 0 ||
                shard >= nshards) {
                fprintf(stderr, "nib_tests: --shard needs I/N with 0 <= I < N, e.g. --shard 0/4\n");
                return 2;
            }
            i++;
        } else filter = argv[i];
    }
    qsort(g_tests, (size_t)g_ntests, sizeof g_tests[0], cmp_tests);
    if (list) {
        for (int i = 0, sel = 0; i < g_ntests; i++)
            if (nib_test_name_matches(g_tests[i].name, filter) && sel++ % nshards == shard) printf("%s\n", g_tests[i].name);
        return 0;
    }
    uint64_t seed = 1;
    const char *se = getenv("NIB_TEST_SEED");
    if (se && *se) seed = strtoull(se, NULL, 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0, sel = 0; i < g_ntests; i++) {
        if (!nib_test_name_matches(g_tests[i].name, filter) || sel++ % nshards != shard) continue;
        nib_test_ctx t;
        memset(&t, 0, sizeof t);
        t.name = g_tests[i].name;
        t.seed = seed;
        nib_clear_error();
        double t0 = nib_now_s();
        g_tests[i].fn(&t);
        double dt = nib_now_s() - t0;
        if (t.failures) {
            printf("FAIL %s (%d failed checks, %.2f s)\n", t.name, t.failures, dt);
            failed++;
        } else if (t.skipped) {
            printf("SKIP %s: %s\n", t.name, t.skip_reason);
            skipped++;
        } else {
            printf("PASS %s (%.2f s)\n", t.name, dt);
            passed++;
        }
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
