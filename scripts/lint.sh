#!/usr/bin/env bash
# lint.sh — nib's reliability lint (run by `make lint` and .ci/run). Prints "file:line: what"
# for each violation and exits 1 if there is any; exits 0 with a one-line summary otherwise.
#
# (a) CUDA / cuBLAS(Lt) / driver API calls in *.c *.h *.cu *.cuh (everywhere but build dirs):
#     every call of cudaX(...), cublasX(...) or cuX(...) must be
#       - the argument of a checking macro on the same statement: NIB_CUDA_CHECK, NIB_CUDA_TRY,
#         NIB_BLAS_CHECK, NIB_BLAS_TRY, NIB_CU_CHECK, NIB_CU_TRY, or a test's CHECK/REQUIRE;
#       - compared with its success value right where it is called
#         (`cudaX(...) == cudaSuccess`, `!= CUBLAS_STATUS_SUCCESS`, `CUDA_SUCCESS`);
#       - assigned to a variable that is tested within the next 8 lines
#         (`if (e ...`, `e != ...`, `NIB_CUDA_CHECK(e)`, `nib_cuda_status(e, ...`, `return e`);
#       - or whitelisted with a `/* unchecked: reason */` comment on the same line.
#     Exempt (cannot fail): cudaGetErrorName/String, cuGetErrorName/String,
#     cublas(Lt)GetStatusName/String.
#     Every <<<...>>> launch must be followed by NIB_LAUNCH_CHECK or a cudaGetLastError /
#     cudaPeekAtLastError check, with nothing in between but other launches, braces, blank lines,
#     comments and control-flow words (case/default/break/else/if (...)).
# (b) Library code (base/ formats/ io/ ops/ runtime/ models/) never exits or aborts: no exit(,
#     _exit(, _Exit(, quick_exit(, abort(, assert(, __builtin_trap(, __trap( (device asserts
#     and traps make the CUDA context unusable). The CLI, tests, benches and fuzz harnesses may.
# Comments and string literals are ignored for both rules (a whitelist comment is read from the
# raw line).
#
# Before linting the tree it lints a few fixture files with known violations (self_test below)
# and stops with exit 2 if it does not report exactly those: a lint that cannot fail is a defect.
#
# Usage: scripts/lint.sh [--baseline FILE] [FILE...]   (default: every source file of the tree)
#   --baseline FILE  ratchet mode (CI): violations listed in FILE, one "path name" per line
#                    (name = the call, or "launch"; a line per occurrence, no line numbers so
#                    edits elsewhere do not invalidate it) are printed as known and do not fail;
#                    any other violation fails. Fixing one means deleting its line from FILE.
set -euo pipefail
cd "$(dirname "$0")/.."

lint_files() {
awk '
function strip(s,    out, i, c, n, q) {          # code of one line: comments/strings blanked
    out = ""; n = length(s); i = 1
    while (i <= n) {
        c = substr(s, i, 1)
        if (inblock) {
            if (substr(s, i, 2) == "*/") { inblock = 0; out = out "  "; i += 2 } else { out = out " "; i++ }
            continue
        }
        if (substr(s, i, 2) == "/*") { inblock = 1; out = out "  "; i += 2; continue }
        if (substr(s, i, 2) == "//") break
        if (c == "\"" || c == "\047") {
            q = c; out = out c; i++
            while (i <= n && substr(s, i, 1) != q) {
                if (substr(s, i, 1) == "\\") { out = out " "; i++ }
                out = out " "; i++
            }
            if (i <= n) { out = out q; i++ }
            continue
        }
        out = out c; i++
    }
    return out
}
function report(f, l, what) { printf "%s:%d: %s\n", f, l, what; nviol++ }
function is_library(f) { return f ~ /^(base|formats|io|ops|runtime|models)\// }
# text of lines l..l+extra joined, from column col of line l
function joined(l, col, extra,    t, k) {
    t = substr(code[l], col)
    for (k = 1; k <= extra && l + k <= nl; k++) t = t " " code[l + k]
    return t
}
# index just past the ")" closing the "(" at position p of t (0 if unbalanced)
function close_paren(t, p,    d, k, c) {
    d = 0
    for (k = p; k <= length(t); k++) {
        c = substr(t, k, 1)
        if (c == "(") d++
        else if (c == ")") { d--; if (d == 0) return k + 1 }
    }
    return 0
}
function checked_var(v, l,    k, t, vr) {
    vr = "(^|[^A-Za-z0-9_])" v "([^A-Za-z0-9_]|$)"
    for (k = l; k <= l + 8 && k <= nl; k++) {
        t = code[k]
        if (k == l) { sub(/^.*=[ \t]*(cuda|cublas|cu)[A-Za-z0-9_]*[ \t]*\(/, "", t) }
        if (t !~ vr) continue
        if (t ~ ("if[ \t]*\\(.*" v) || t ~ (v "[ \t]*[!=]=") || t ~ ("[!=]=[ \t]*" v) ||
            t ~ ("(NIB_[A-Z_]+|nib_cuda_status|blas_status|nib_blas_status)[ \t]*\\(.*" v) ||
            t ~ ("return[ \t].*" v) || t ~ ("(while|switch)[ \t]*\\(.*" v))
            return 1
    }
    return 0
}
function analyze(f,    l, t, rest, pos, name, before, after, end, ctx, prev, v, k, ok, s) {
    for (l = 1; l <= nl; l++) {
        t = code[l]
        # ---- (b) no exit/abort in library code
        if (is_library(f)) {
            rest = t
            while (match(rest, /(^|[^A-Za-z0-9_.>])(exit|_exit|_Exit|quick_exit|abort|assert|__builtin_trap|__trap)[ \t]*\(/)) {
                s = substr(rest, RSTART, RLENGTH); sub(/^[^A-Za-z_]/, "", s); sub(/[ \t]*\($/, "", s)
                report(f, l, "library code calls " s "(): return a nib_status instead (the C API never exits or aborts)")
                rest = substr(rest, RSTART + RLENGTH)
            }
        }
        # ---- (a) CUDA / cuBLAS / driver calls
        rest = t; pos = 0
        while (match(rest, /(^|[^A-Za-z0-9_])(cuda[A-Z][A-Za-z0-9_]*|cublas[A-Za-z0-9_]+|cu[A-Z][A-Za-z0-9_]*)[ \t]*\(/)) {
            s = substr(rest, RSTART, RLENGTH)
            k = (s ~ /^[^A-Za-z_]/) ? 1 : 0
            name = substr(s, 1 + k); sub(/[ \t]*\($/, "", name)
            start = pos + RSTART + k            # column of the name in code[l]
            pos = pos + RSTART + RLENGTH - 1
            rest = substr(t, pos + 1)
            if (name ~ /^(cudaGetErrorName|cudaGetErrorString|cuGetErrorName|cuGetErrorString|cublasGetStatusName|cublasGetStatusString|cublasLtGetStatusName|cublasLtGetStatusString)$/) continue
            if (raw[l] ~ /\/\*[ \t]*unchecked:[ \t]*[^ \t*]/) continue
            before = substr(t, 1, start - 1)
            prev = ""
            for (k = l - 1; k >= 1 && k >= l - 2; k--) {         # a wrapper opened on an earlier line
                if (code[k] ~ /^[ \t]*$/) continue
                if (code[k] ~ /[(,=&|][ \t]*$/) prev = code[k] " " prev; else break
            }
            ctx = prev before
            ok = 0
            if (ctx ~ /(NIB_CUDA_CHECK|NIB_CUDA_TRY|NIB_BLAS_CHECK|NIB_BLAS_TRY|NIB_CU_CHECK|NIB_CU_TRY|NIB_LAUNCH_CHECK|CHECK|CHECK_MSG|REQUIRE)[ \t]*\(/) ok = 1
            if (!ok && before ~ /(cudaSuccess|CUBLAS_STATUS_SUCCESS|CUDA_SUCCESS)[ \t]*[!=]=[ \t]*$/) ok = 1
            if (!ok) {
                after = joined(l, start, 4)
                end = close_paren(after, index(after, "("))
                if (end > 0 && substr(after, end) ~ /^[ \t]*[!=]=[ \t]*(cudaSuccess|CUBLAS_STATUS_SUCCESS|CUDA_SUCCESS)/) ok = 1
            }
            if (!ok && match(before, /[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?[ \t]*=[ \t]*(\([A-Za-z_ ]+\)[ \t]*)?$/)) {
                v = substr(before, RSTART, RLENGTH); sub(/[ \t]*=.*$/, "", v); sub(/\[.*$/, "", v)
                if (v != "" && checked_var(v, l)) ok = 1
            }
            if (!ok) report(f, l, "unchecked call " name "(): wrap it in NIB_CUDA_CHECK/NIB_CUDA_TRY/NIB_BLAS_CHECK, test its result, or mark it /* unchecked: reason */")
        }
        # ---- (a) every <<<...>>> launch is followed by a launch check
        if (t ~ /<<</) {
            k = l
            while (k <= nl && code[k] !~ /;/) k++           # end of the launch statement
            ok = 0
            for (k = k + 1; k <= nl && k <= l + 12; k++) {
                s = code[k]
                if (s ~ /NIB_LAUNCH_CHECK|cudaGetLastError|cudaPeekAtLastError/) { ok = 1; break }
                if (s ~ /<<</) { while (k <= nl && code[k] !~ /;/) k++; continue }
                gsub(/(case[^:]*:|default[ \t]*:|break[ \t]*;|else|if[ \t]*\([^;]*\)|[{}])/, "", s)
                if (s ~ /^[ \t]*$/) continue
                break
            }
            if (!ok) report(f, l, "kernel launch <<<...>>> not followed by NIB_LAUNCH_CHECK (or a cudaGetLastError check)")
        }
    }
}
FNR == 1 {
    if (NR > 1) analyze(fname)
    fname = FILENAME; nl = 0; inblock = 0; nfiles++
}
{ nl++; raw[nl] = $0; code[nl] = strip($0) }
END {
    if (nfiles) analyze(fname)
    if (nviol) { printf "lint: %d violation(s) in %d files checked\n", nviol, nfiles; exit 1 }
    printf "lint: OK (%d files checked)\n", nfiles
}
' "$@"
}

# Fixtures: runtime/good.cu and cli/ok.c must pass; runtime/bad.cu must give exactly the lines
# listed in `want`.
self_test() {
    local tmp got want
    tmp=$(mktemp -d)
    mkdir -p "$tmp/runtime" "$tmp/cli"
    cat >"$tmp/runtime/good.cu" <<'FIX'
NIB_CUDA_CHECK(cudaMemcpy(a, b, n, cudaMemcpyDefault));
cudaError_t e = cudaMalloc(&p, n);
if (e != cudaSuccess) return 1;
if (cudaStreamSynchronize(s) == cudaSuccess) x = 1;
NIB_CUDA_TRY(
    cudaMemset(p, 0, n));
cudaFree(p); /* unchecked: cleanup path, the first error is the one reported */
const char *m = cudaGetErrorString(e);
k<<<1, 1>>>(p);
NIB_LAUNCH_CHECK("k");
switch (v) {
case 1: k<<<1, 1, 0, s>>>(p); break;
default: k2<<<1, 1, 0, s>>>(p,
                            q); break;
}
NIB_LAUNCH_CHECK("k");
/* a comment naming cudaMalloc( and exit( is fine,
   over two lines: abort( */
printf("cudaFree( exit( abort(");
static_assert(sizeof(int) == 4, "int");
NIB_BLAS_CHECK(cublasLtMatmul(h, op, &a, w, la, x, lb, &b, y, ld, y, ld, &algo, ws, n, s));
FIX
    cat >"$tmp/runtime/bad.cu" <<'FIX'
cudaFree(p);
if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
cudaError_t e = cudaMalloc(&p, n);
x = 1;
k<<<1, 1>>>(p);
x = 2;
NIB_LAUNCH_CHECK("k");
exit(1);
abort();
assert(x);
cublasLtMatmulPreferenceSetAttribute(p, A, &w, sizeof w);
cudaGetLastError(); /* clear */
FIX
    printf 'int main(void) { assert(1); exit(0); abort(); }\n' >"$tmp/cli/ok.c"
    got=$(cd "$tmp" && lint_files runtime/good.cu runtime/bad.cu cli/ok.c | sed -n 's/^\([^:]*:[0-9]*\):.*/\1/p' | tr "\n" " " || true)
    want="runtime/bad.cu:1 runtime/bad.cu:2 runtime/bad.cu:3 runtime/bad.cu:5 runtime/bad.cu:8 runtime/bad.cu:9 runtime/bad.cu:10 runtime/bad.cu:11 runtime/bad.cu:12 "
    rm -rf "$tmp"
    if [ "$got" != "$want" ]; then
        echo "lint: self-test FAILED: reported '$got', expected '$want'" >&2
        exit 2
    fi
}

baseline=
if [ "${1:-}" = "--baseline" ]; then
    baseline=$2
    shift 2
    [ -f "$baseline" ] || { echo "lint: no baseline file '$baseline'" >&2; exit 2; }
fi
self_test
if [ $# -gt 0 ]; then
    files=("$@")
else
    mapfile -t files < <(find . -path './build*' -prune -o -path './.git' -prune -o \
        -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print |
        sed 's|^\./||' | LC_ALL=C sort)
fi
[ ${#files[@]} -gt 0 ] || { echo "lint: no files"; exit 0; }
if [ -z "$baseline" ]; then
    lint_files "${files[@]}"
    exit
fi
out=$(lint_files "${files[@]}" || true)
# key of a violation: "path name" (name: the call, or "launch")
# (grep finds nothing on a clean tree: that is not a failure under pipefail)
printf '%s\n' "$out" | { grep -v '^lint: ' || true; } | { grep . || true; } | awk -v base="$baseline" '
BEGIN { while ((getline l < base) > 0) { sub(/#.*/, "", l); gsub(/^[ \t]+|[ \t]+$/, "", l); if (l != "") allow[l]++ } }
{
    f = $1; sub(/:[0-9]+:$/, "", f)
    if ($0 ~ /kernel launch/) name = "launch"
    else { name = $0; sub(/\(\).*$/, "", name); sub(/^.* /, "", name) }
    key = f " " name
    if (used[key] < allow[key]) { used[key]++; known++; print $0 "  [known: " base "]" }
    else { fresh++; print $0 "  [NEW]" }
}
END {
    for (k in allow) if (used[k] < allow[k]) stale += allow[k] - used[k]
    printf "lint: %d new violation(s), %d known (listed in %s)", fresh, known, base
    if (stale) printf "; %d baseline line(s) no longer needed: delete them", stale
    printf "\n"
    exit fresh ? 1 : 0
}'
