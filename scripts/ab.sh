#!/usr/bin/env bash
# ab.sh — A/B timing of two versions of nib in one device call, alternating runs on one GPU.
#
#   scripts/ab.sh prepare REV [DIR]    (on your machine) write into DIR (default ab-base/) the
#                                      files that differ between REV and the working tree, as
#                                      they are at REV (deleted files are not supported). DIR
#                                      is untracked, so the device copy of the tree carries it.
#   scripts/ab.sh run [DIR] [-n N] [-q] [-- BENCH ARGS]
#                                      (on the GPU machine) build this tree (build/) and a copy
#                                      with DIR's files laid over it (/tmp/nib-ab-base), then run
#                                      `nib bench BENCH ARGS` N times (default 2) for each,
#                                      alternating base / new; default bench args:
#                                      pi05 --preset fast --cams 2 --reps 200
#                                      -q: quantize the synthetic checkpoint once (`nib quantize
#                                      --pi05 fast`, this tree's build) and pass it as --checkpoint,
#                                      so each run loads in ~3 s instead of quantizing for ~18 s
#                                      (the fast preset's rows only: the file decides the formats)
#   scripts/ab.sh env [-n N] [-q] -e 'VAR=V ...' [-e ...] [-- BENCH ARGS]
#                                      (on the GPU machine) one build of this tree, then
#                                      `nib bench BENCH ARGS` N times under each environment given
#                                      with -e (an empty one is the default), alternating; labels
#                                      "== env '<VARS>' (run i)"; -q and the default args as for run
#   scripts/ab.sh flags [-n N] [-q] -f 'NVCC FLAGS' [-f ...] [-- BENCH ARGS]
#                                      (on the GPU machine) this tree built plainly (build/) and once
#                                      per -f with those flags added to every nvcc call (the Makefile's
#                                      NIB_LAB_NVCCFLAGS, into build-ab1/, build-ab2/, ...; the builds run
#                                      side by side), then `nib bench BENCH ARGS` N times for each,
#                                      alternating; labels "== flags '<FLAGS>' (run i)" ('' = plain);
#                                      for compile-time lab switches such as -DNIB_GEMM_LAB_DECODE=2
#
# The device copy's git metadata may lack your latest commits, so the base version travels as
# files, not as a revision. Output: one block per run, labelled "== base" / "== new".
# scripts/ab_json.py LOG --bench ... --command ... -o bench/results/X.json turns the saved output into a
# results record (one row per bench row, with its label and run) and prints the versions side by side.
set -euo pipefail
cmd=${1:-}
shift || true
# the modes' options: -n N, -q, -e 'VARS' (env), -f 'FLAGS' (flags), then -- and the bench args
parse_opts() {
    reps=2 quant=0 envs=() flags=()
    while [ $# -gt 0 ]; do
        case "$1" in
        -n) reps=$2; shift 2 ;;
        -q) quant=1; shift ;;
        -e) envs+=("$2"); shift 2 ;;
        -f) flags+=("$2"); shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(pi05 --preset fast --cams 2 --reps 200)
}
# -q: the synthetic checkpoint quantized once with this tree's build, passed as --checkpoint
quantized_args() {
    local ckpt=${TMPDIR:-/tmp}/nib-demo-pi05.safetensors q=${TMPDIR:-/tmp}/nib-ab-fast.safetensors
    [ -f "$ckpt" ] || ./build/nib demo >/dev/null
    ./build/nib quantize "$ckpt" "$q" --pi05 fast --force -q
    args+=(--checkpoint "$q")
}
case "$cmd" in
prepare)
    rev=${1:?usage: scripts/ab.sh prepare REV [DIR]}
    dir=${2:-ab-base}
    rm -rf "$dir"
    mkdir -p "$dir"
    n=0
    while IFS= read -r f; do
        [ -n "$f" ] || continue
        if ! git cat-file -e "$rev:$f" 2>/dev/null; then
            echo "ab.sh: $f does not exist at $rev (added since): not supported" >&2
            exit 1
        fi
        mkdir -p "$dir/$(dirname "$f")"
        git show "$rev:$f" >"$dir/$f"
        n=$((n + 1))
    done < <(git diff --name-only "$rev" -- . ":(exclude)$dir")
    echo "ab.sh: $n file(s) of $rev in $dir/"
    ;;
env)
    parse_opts "$@"
    [ ${#envs[@]} -ge 1 ] || { echo "ab.sh env: give at least one -e 'VAR=V ...'" >&2; exit 1; }
    make -j"$(nproc)" >/dev/null
    [ "$quant" = 1 ] && quantized_args
    for i in $(seq "$reps"); do
        for e in "${envs[@]}"; do
            echo "== env '$e' (run $i)"
            # word splitting of $e is the point: each VAR=V becomes one argument of env
            # shellcheck disable=SC2086
            env $e ./build/nib bench "${args[@]}"
        done
    done
    ;;
run)
    dir=ab-base
    case "${1:-}" in -* | "") ;; *) dir=$1; shift ;; esac
    parse_opts "$@"
    [ -d "$dir" ] || { echo "ab.sh: no $dir/ (scripts/ab.sh prepare REV first)" >&2; exit 1; }
    jobs=$(nproc)
    base=/tmp/nib-ab-base
    rm -rf "$base"
    mkdir -p "$base"
    # the tree without build outputs or the base files themselves, then the base files on top
    tar --exclude=./build --exclude="./build-*" --exclude="./$dir" --exclude=./.git -cf - . | tar -xf - -C "$base"
    cp -a "$dir/." "$base/"
    # both builds side by side: each ends in one long compile (gemm_lowbit.cu), which then overlap
    make -j"$jobs" >/dev/null & pn=$!
    make -C "$base" -j"$jobs" >/dev/null & pb=$!
    wait "$pn" || { echo "ab.sh run: the new build failed" >&2; exit 1; }
    wait "$pb" || { echo "ab.sh run: the base build failed" >&2; exit 1; }
    [ "$quant" = 1 ] && quantized_args
    for i in $(seq "$reps"); do
        for v in base new; do
            bin=./build/nib
            [ "$v" = base ] && bin=$base/build/nib
            echo "== $v (run $i)"
            "$bin" bench "${args[@]}"
        done
    done
    ;;
flags)
    parse_opts "$@"
    [ ${#flags[@]} -ge 1 ] || { echo "ab.sh flags: give at least one -f 'FLAGS'" >&2; exit 1; }
    jobs=$(nproc)
    pids=()
    make -j"$jobs" >/dev/null & pids+=($!)
    for k in "${!flags[@]}"; do
        make BUILD="build-ab$((k + 1))" NIB_LAB_NVCCFLAGS="${flags[$k]}" -j"$jobs" "build-ab$((k + 1))/nib" >/dev/null &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || { echo "ab.sh flags: a build failed" >&2; exit 1; }; done
    [ "$quant" = 1 ] && quantized_args
    for i in $(seq "$reps"); do
        echo "== flags '' (run $i)"
        ./build/nib bench "${args[@]}"
        for k in "${!flags[@]}"; do
            echo "== flags '${flags[$k]}' (run $i)"
            "./build-ab$((k + 1))/nib" bench "${args[@]}"
        done
    done
    ;;
*)
    sed -n '2,32p' "$0"
    exit 2
    ;;
esac
