#!/usr/bin/env bash
# sanitize.sh — compute-sanitizer over nib's test suite on a GPU machine (issue 7, goal G6).
#
#   scripts/sanitize.sh                    negative control, then memcheck, racecheck, synccheck
#                                          and initcheck over every test (whole suite per tool)
#   scripts/sanitize.sh --negative-control only the negative control
#   scripts/sanitize.sh --tools "memcheck" --filter gpu    a subset (FILTER = nib_tests substrings,
#                                          comma-separated: --filter pi05_gpu,blas_gpu)
#   scripts/sanitize.sh --tools racecheck --shard 1/4      the second of 4 round-robin shards of the
#                                          selected tests (one device call each, for the slow tools)
#   scripts/sanitize.sh --tools racecheck --split 8     the 8 shards at once, one process each
#                                          sharing the GPU (logs sanitize-racecheck-<i>o8.log);
#                                          each tool's shards finish before the next tool starts
#   scripts/sanitize.sh --parallel --timeout 540          the four tools at once (one GPU is
#                                          enough: each process holds < 10 GB), each killed after
#                                          540 s (a tool that does not finish fails the run)
#
# Builds (CUDA, -lineinfo): BUILD_DIR (default build-sanitize) for the suite, and
# build-sanitize-negctl with `make NIB_NEGATIVE_CONTROL=1`, whose test
# negative_control_gpu_oob_write writes one float past a cudaMalloc'ed buffer. The negative
# control passes only when memcheck REPORTS that write ("Invalid __global__ write") and exits
# non-zero: a sanitizer job that sees nothing may be blind (cuDF once passed silently because
# compute-sanitizer was not installed), so it runs first and its failure stops the script.
# Then each tool runs the whole suite with --error-exitcode 1; the script prints one line per
# tool ("sanitize <tool>: N errors, exit E, T s, log L") and exits 1 unless every tool reports
# 0 errors and the tests pass. Logs: $BUILD_DIR/sanitize-<tool>.log.
#
# What the tools can and cannot see here: memcheck checks accesses against whole allocations;
# nib's weight slab and activation arena are single cudaMalloc allocations with bump
# suballocation (runtime/device.h), so an overrun from one tensor into its neighbour inside an
# arena is invisible to memcheck (the ops tests' guard values cover that; each test buffer of
# the op tests is its own allocation). racecheck checks shared memory only. initcheck reports
# reads of device memory never written (e.g. vector loads past a row into arena padding).
set -uo pipefail
cd "$(dirname "$0")/.."

tools="memcheck racecheck synccheck initcheck"
filter=""
shard=""
only_negctl=0
parallel=0
split=0
tlimit=0
build=${BUILD_DIR:-build-sanitize}
negbuild=build-sanitize-negctl
while [ $# -gt 0 ]; do
    case "$1" in
        --negative-control) only_negctl=1 ;;
        --tools) tools=$2; shift ;;
        --filter) filter=$2; shift ;;
        --shard) shard=$2; shift ;;
        --parallel) parallel=1 ;;
        --split) split=$2; shift ;;
        --timeout) tlimit=$2; shift ;;
        -h|--help) sed -n '2,/^set -uo/{/^set -uo/!p}' "$0"; exit 0 ;;
        *) echo "sanitize: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
san=$(command -v compute-sanitizer 2>/dev/null || true)
for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
    [ -z "$san" ] && [ -x "$c" ] && san=$c
done
if [ -z "$san" ]; then
    echo "sanitize: FAILED: compute-sanitizer not found (PATH, $CUDA_HOME/bin, $CUDA_HOME/compute-sanitizer)" >&2
    exit 1
fi
echo "sanitize: $san ($("$san" --version 2>/dev/null | grep -i version | head -1))"
jobs=$(nproc 2>/dev/null || echo 4)

# ---- negative control -------------------------------------------------------------------
make BUILD="$negbuild" NIB_NEGATIVE_CONTROL=1 -j"$jobs" "$negbuild/nib_tests" >"$negbuild.build.log" 2>&1 ||
    { echo "sanitize: FAILED: negative-control build (see $negbuild.build.log)" >&2; exit 1; }
tag=$tools${shard:+-$shard}
[ "$split" -gt 0 ] && tag="$tag-split$split"
neglog=$negbuild/sanitize-negative-control-$(echo "$tag" | tr " /" "-o").log # several invocations may run at once
"$san" --tool memcheck --error-exitcode 1 --print-limit 20 \
    "$negbuild/nib_tests" negative_control_gpu_oob_write >"$neglog" 2>&1
rc=$?
if grep -q "SKIP negative_control_gpu_oob_write" "$neglog"; then
    echo "sanitize: FAILED: the negative control skipped (no usable GPU, or not built with NIB_NEGATIVE_CONTROL=1): $neglog" >&2
    exit 1
fi
if [ $rc -ne 0 ] && grep -q "Invalid __global__ write" "$neglog"; then
    echo "sanitize negative control: memcheck reported the deliberate out-of-bounds write (exit $rc): OK"
else
    echo "sanitize: FAILED: memcheck did NOT report the negative control's out-of-bounds write (exit $rc); the sanitizer job is blind. Log: $neglog" >&2
    tail -n 30 "$neglog" >&2
    exit 1
fi
[ $only_negctl -eq 1 ] && exit 0

# ---- the suite under each tool ----------------------------------------------------------
make BUILD="$build" -j"$jobs" "$build/nib_tests" >"$build.build.log" 2>&1 ||
    { echo "sanitize: FAILED: build (see $build.build.log)" >&2; exit 1; }
run_tool() { # tool shard(i/N or "") log -> exit status of the sanitizer (124: killed by --timeout)
    local tool=$1 sh=$2 log=$3 extra=()
    case "$tool" in
        memcheck) extra=(--leak-check full) ;;
        # cuBLASLt's Hopper kernels (nvjet*) order shared memory with TMA and mbarriers, which
        # racecheck does not model: races with both accesses inside one of them are suppressed
        # (scripts/sanitize-suppressions.xml says why and what was tried); every nib kernel is
        # still checked. Analysis reports (the default) are the ones suppressions match.
        racecheck) extra=(--racecheck-report analysis --suppressions scripts/sanitize-suppressions.xml) ;;
        initcheck|synccheck) ;;
        *) echo "sanitize: unknown tool '$tool'" >&2; return 2 ;;
    esac
    local pre=()
    [ "$tlimit" -gt 0 ] && pre=(timeout "$tlimit")
    # --require-cuda-init no: a shard whose tests all skip before touching CUDA is not an error
    "${pre[@]}" "$san" --tool "$tool" "${extra[@]}" --require-cuda-init no --error-exitcode 1 --print-limit 200 \
        "$build/nib_tests" ${sh:+--shard "$sh"} $filter >"$log" 2>&1
}
report_run() { # label rc seconds log -> one line; returns 1 on any error
    local label=$1 rc=$2 secs=$3 log=$4
    local errs summary
    errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -1)
    [ -z "$errs" ] && errs=$(grep -c "^========= \(Invalid\|Race\|Uninitialized\|Barrier\|Program hit\|Error\)" "$log")
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
    local why=""
    [ "$rc" -eq 124 ] && why=" (killed after ${tlimit} s: did not finish)"
    echo "sanitize $label: $errs errors, exit $rc$why, $secs s, tests: ${summary:-no summary line}, log $log"
    if [ "$rc" -ne 0 ] || [ "${errs:-1}" != "0" ] || [ -z "$summary" ]; then
        grep -E "^========= (Invalid|Race|Uninitialized|Barrier|Program hit|Error|    at )" "$log" | head -n 20
        return 1
    fi
    return 0
}
# tests that provoke device errors on purpose skip, heavy repetition shrinks (tests/harness.h)
export NIB_UNDER_SANITIZER=1
# the runs: one per tool, or with --split N one per tool and shard i/N (label tool[i/N])
runs=()
for tool in $tools; do
    if [ "$split" -gt 0 ]; then
        for ((i = 0; i < split; i++)); do runs+=("$tool $i/$split"); done
    else
        runs+=("$tool $shard")
    fi
done
launch() { # "tool shard" -> sets tl (tool), sh (shard or empty), lab (label), lg (log)
    set -- $1
    tl=$1 sh=${2:-}
    lab=$tl${sh:+[$sh]}
    lg=$build/sanitize-$tl${sh:+-$(echo "$sh" | tr / o)}.log
}
# Runs of one group go at once, groups one after another: all runs form one group with
# --parallel, each tool's shards one with --split, and otherwise every run is its own group.
group_of() { # "tool shard" -> its group key
    if [ $parallel -eq 1 ]; then echo "*"; elif [ "$split" -gt 0 ]; then echo "${1%% *}"; else echo "$1"; fi
}
fail=0
declare -A pid
keys=()
for r in "${runs[@]}"; do
    k=$(group_of "$r")
    [[ " ${keys[*]-} " == *" [$k] "* ]] || keys+=("[$k]")
done
for key in "${keys[@]}"; do
    t0=$(date +%s)
    group=()
    for r in "${runs[@]}"; do [ "[$(group_of "$r")]" = "$key" ] && group+=("$r"); done
    for r in "${group[@]}"; do
        launch "$r"; run_tool "$tl" "$sh" "$lg" & pid[$r]=$!
    done
    for r in "${group[@]}"; do
        launch "$r"; wait "${pid[$r]}"; rc=$?
        report_run "$lab" $rc $(( $(date +%s) - t0 )) "$lg" || fail=1
    done
done
if [ $fail -ne 0 ]; then
    echo "sanitize: FAILED (see the logs above)"
    exit 1
fi
echo "sanitize: OK: negative control caught; $tools: 0 errors"
