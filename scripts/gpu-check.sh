#!/usr/bin/env bash
# gpu-check.sh — everything that needs the GPU, in one call: build, `nib doctor`, every test
# (GPU tests included), the kernel labs, and optionally compute-sanitizer. Logs and JSON go
# to $OUT (default ./gpu-out); a short table is printed last.
#
#   scripts/gpu-check.sh [build] [doctor] [tests] [gemm] [ops] [attn] [demo] [pi05] [accuracy]
#                        [load] [sanitize] [profile] [fp8prof] [attnprof] [expertprof] [pi05prof] [ktrace] [experttrace] [plansearch] [T=filter]
#   (no step names = build doctor tests gemm ops attn demo pi05 accuracy load)
#   demo      nib demo (synthesizes the full-size checkpoint in $TMPDIR once)
#   pi05      nib bench pi05 --json pi05.json
#   accuracy  nib accuracy pi05 --json pi05-accuracy.json
#   profile   Nsight Compute counters of nib's low-bit GEMM (ncu-gemm-m<M>.csv), one ncu run per
#             M in PROFILE_M (default 16,50) on PROFILE_SHAPES (default 1024:2560), format
#             PROFILE_VARIANT (nvfp4); clocks left as they are (--clock-control none);
#             PROFILE_SOURCE=1 adds the stall reasons (ncu-gemm-raw-m<M>.csv) and per-SASS-
#             instruction samples (ncu-gemm-sass-m<M>.csv) of one launch
#   attn      nib bench attn --json attn.json $ATTN_ARGS
#   attnprof  Nsight Compute on the decode rows of nib bench attn (ATTNPROF_T, ATTNPROF_KV): details,
#             raw stall reasons (summarized per kernel into attnprof-stalls.txt by scripts/ncu_stalls.py)
#             and, with ATTNPROF_SASS=1, per-SASS-instruction samples; every CSV goes into attnprof.tgz
#             (the device tool returns a limited number of files)
#   expertprof  Nsight Compute on the persistent expert kernel (application replay: kernel replay
#             cannot relaunch its cooperative cluster launch), one launch of the first, eager call
#             (EXPERTPROF_SKIP launches skipped, default 5): details (ncu-expert.csv: warp states,
#             instruction fetch stalls included) and per-SASS-instruction samples (ncu-expert-sass.csv).
#             BROKEN since at least 2026-11-27 (ncu 2025.3.1, driver 13.0): profiling k_expert fails with
#             cudaErrorIllegalInstruction (sections) or exits 9 silently (--metrics gpu__time_duration.sum),
#             with NIB_PDL=0, NIB_OVERLAP=0 and NIB_EXPERT_BULK=0 too; ncu attached without profiling it
#             runs clean, and so does compute-sanitizer. Use experttrace (clock64 segments) meanwhile.
#   fp8prof   Nsight Compute on nib's FP8 GEMM (one launch of `nib bench gemm --variants $FP8PROF_VARIANT`, default
#             fp8-nib, or fp8-nib-geglu: the persistent GeGLU kernel the prefix runs; FP8PROF_SHAPES default 2048:32768,
#             FP8PROF_M default 532): raw stall reasons summarized into fp8prof-stalls.txt, and per-SASS-instruction
#             samples (ncu-fp8-sass.csv)
#   pi05prof  Nsight Compute's duration of every kernel of one `nib run pi05` call (PI05PROF_PRESET,
#             default fast; 2 cameras, 20 text tokens; kernels serialized, caches not flushed;
#             the per-op expert, the default; PI05PROF_FUSED=1 sets NIB_FUSED_STEP=1, which kernel
#             profiling cannot relaunch: the persistent expert kernel), summed per kernel name and stage by scripts/ncu_timeline.py
#             (ncu-pi05.csv, ncu-pi05.txt, with the first PI05PROF_LIST (40) prefix kernels in order);
#             PI05PROF_PRESET, PI05PROF_HORIZON (default 10) and PI05PROF_CAMS (default 2) take comma
#             lists, each triple other than fast / 10 / 2 writing ncu-pi05-<preset>-h<H>-c<cams>.*
#   ktrace    a second build with in-graph kernel stamps (build-kt/, NIB_LAB_NVCCFLAGS=-DNIB_KTRACE=1; runtime/ktrace.cuh),
#             then `nib bench pi05 --preset fast --cams $KTRACE_CAMS (1) --horizon $KTRACE_HORIZON (10) --reps 30` under each environment of
#             KTRACE_ENVS (';'-separated; default: NIB_OVERLAP=0, the same with NIB_FP8_GEGLU_PDL=1, the default, and
#             NIB_FP8_GEGLU_PDL=1), each summarized by scripts/ktrace.py $KTRACE_ARGS (default --blocks --detail: the
#             prefix's GeGLU kernel, the norm before it and the row quantization after it, per layer; --expert: the
#             per-op flow steps' launches, boundaries and runs) into ktrace-<i>.txt; KTRACE_HORIZON (10) sets H;
#             KTRACE_FLAGS: more nvcc flags for build-kt (a lab switch, e.g. -DNIB_GEMM_LAB_WARM=1)
#   experttrace  NIB_FUSED_STEP=1 NIB_EXPERT_TRACE=1 nib bench pi05 --preset fast --cams 2 --horizon 10 (experttrace.log):
#             the persistent expert kernel's per-phase times and per-CTA segments
#   plansearch  scripts/plan_search.py $PLANSEARCH_ARGS (plan-search.json, plansearch.log): the in-model
#             coordinate search over the expert products' plans (fast, 2 cameras, H = 10 unless the args say);
#             PLANSEARCH_BUDGET seconds (default 400) bound it, so leave room for the other steps
#   load      nib quantize --pi05 fast of the synthetic checkpoint, then nib run --timing on it:
#             time from file to the first call done
#   overlap   A/B of the first flow step beside the prefix (overlap.log, overlap-ab.txt), each row
#             OVERLAP_REPS (2) times alternated: bf16 2 cameras H = 10 and fast 3 cameras H = 50 with
#             NIB_OVERLAP_OPS=0 / default; fast H = 10 at 1 / 2 / 3 cameras with NIB_OVERLAP_FIRST_OPS=0
#             (the persistent kernel's first layers beside the prefix) against the per-op step, both with
#             NIB_FUSED_STEP=1 (the persistent kernel runs the other steps)
# Environment: NIB_GIT_COMMIT (recorded in the JSON; pass the commit from the machine you commit on:
#              the device copy's git metadata may not have your latest commits), JOBS (make -j, default nproc),
#              GEMM_ARGS / ATTN_ARGS / PI05_ARGS (extra args for nib bench gemm / attn / pi05), SAN_ARGS (extra args for
#              scripts/sanitize.sh in the sanitize step, e.g. "--tools racecheck --split 8";
#              its logs come back as sanitize-logs.tgz).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOG=$OUT/gpu-check.log
JOBS=${JOBS:-$(nproc)}
steps=()
filter=""
for a in "$@"; do
    case "$a" in T=*) filter=${a#T=} ;; *) steps+=("$a") ;; esac
done
[ ${#steps[@]} -eq 0 ] && steps=(build doctor tests gemm ops attn demo pi05 accuracy load)
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
note() { summary+=("$1"); echo "== $1" | tee -a "$LOG"; }
t0=$(date +%s)

if has build; then
    if make -j"$JOBS" >>"$LOG" 2>&1; then note "build: ok ($(( $(date +%s) - t0 )) s)"
    else note "build: FAILED (see gpu-check.log)"; tail -40 "$LOG"; exit 1; fi
fi
if has doctor; then
    ./build/nib doctor | tee -a "$LOG"
    ./build/nib doctor --json >"$OUT/doctor.json" 2>>"$LOG" && note "doctor: $(head -c 300 "$OUT/doctor.json")"
fi
if has tests; then
    ./build/nib_tests $filter >"$OUT/tests.log" 2>&1
    rc=$?
    grep -E "^(FAIL|  FAIL)" "$OUT/tests.log" | head -40 | tee -a "$LOG"
    note "tests (rc $rc): $(tail -1 "$OUT/tests.log")"
fi
if has sanitize; then
    # scripts/sanitize.sh: negative control first, then every tool with the project's options
    # (racecheck's suppressions for cuBLASLt's kernels); SAN_ARGS adds e.g. --tools / --split.
    # Default selection: every test that touches the GPU ("gpu" in the name, and the fail_
    # failure-path tests); the other tests never call CUDA, so the tools have nothing to check.
    bash scripts/sanitize.sh --filter "${filter:-gpu,fail_}" ${SAN_ARGS:-} >"$OUT/sanitize.log" 2>&1
    rc=$?
    tar czf "$OUT/sanitize-logs.tgz" build-sanitize/sanitize-*.log 2>/dev/null
    grep -E '^sanitize' "$OUT/sanitize.log" | tee -a "$LOG"
    note "sanitize (rc $rc): $(grep -cE '^sanitize [a-z]+(\[[0-9/]+\])?: 0 errors' "$OUT/sanitize.log") run(s) with 0 errors"
fi
if has profile; then
    # where the low-bit GEMM's time goes at M = 16 vs 50 (issue 3: M = 50 is ~3x M = 16). The
    # bench warms up and replays graphs; ncu profiles the first kernels of the lab's own launches.
    ncu_bin=$(command -v ncu 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
    for pm in $(echo "${PROFILE_M:-16,50}" | tr , ' '); do
        "$ncu_bin" --clock-control none --kernel-name regex:k_gemm_lowbit --launch-count 3 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis --csv --page details \
            ./build/nib bench gemm --shapes "${PROFILE_SHAPES:-1024:2560}" --m "$pm" \
            --variants "${PROFILE_VARIANT:-nvfp4}" --reps 5 >"$OUT/ncu-gemm-m$pm.csv" 2>"$OUT/ncu-gemm-m$pm.err"
        note "profile M=$pm (rc $?): ncu-gemm-m$pm.csv, $(grep -c 'k_gemm_lowbit' "$OUT/ncu-gemm-m$pm.csv") metric rows"
        if [ "${PROFILE_SOURCE:-0}" = 1 ]; then
            # where the warps wait: the stall reasons (raw page) and per-SASS-instruction samples
            # (source page) of one launch
            "$ncu_bin" --clock-control none --kernel-name regex:k_gemm_lowbit --launch-skip 2 --launch-count 1 \
                --section WarpStateStats --section InstructionStats --page raw --csv \
                ./build/nib bench gemm --shapes "${PROFILE_SHAPES:-1024:2560}" --m "$pm" \
                --variants "${PROFILE_VARIANT:-nvfp4}" --reps 5 >"$OUT/ncu-gemm-raw-m$pm.csv" 2>>"$OUT/ncu-gemm-m$pm.err"
            "$ncu_bin" --clock-control none --kernel-name regex:k_gemm_lowbit --launch-skip 2 --launch-count 1 \
                --section SourceCounters --page source --print-source sass --csv \
                ./build/nib bench gemm --shapes "${PROFILE_SHAPES:-1024:2560}" --m "$pm" \
                --variants "${PROFILE_VARIANT:-nvfp4}" --reps 5 >"$OUT/ncu-gemm-sass-m$pm.csv" 2>>"$OUT/ncu-gemm-m$pm.err"
            note "profile M=$pm source (rc $?): ncu-gemm-raw-m$pm.csv, ncu-gemm-sass-m$pm.csv ($(wc -l <"$OUT/ncu-gemm-sass-m$pm.csv") lines)"
        fi
    done
fi
if has fp8prof; then
    # where nib's FP8 GEMM's warps wait (the K loop is 15-35 % behind cuBLASLt's at the prefix's gate|up shape,
    # sixty-second session): one launch past the lab's warm-up of FP8PROF_SHAPES (2048:32768) at FP8PROF_M (532)
    # rows, the plain product (fp8-nib; FP8PROF_VARIANT=fp8-nib-geglu: the GeGLU kernel); raw stall reasons
    # (ncu-fp8-raw.csv, summarized into fp8prof-stalls.txt)
    # and per-SASS-instruction samples (ncu-fp8-sass.csv)
    ncu_bin=$(command -v ncu 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
    fp8_bench=(./build/nib bench gemm --shapes "${FP8PROF_SHAPES:-2048:32768}" --m "${FP8PROF_M:-532}"
               --variants "${FP8PROF_VARIANT:-fp8-nib}" --reps 5)
    "$ncu_bin" --clock-control none --kernel-name regex:k_gemm_fp8 --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section InstructionStats --page raw --csv "${fp8_bench[@]}" \
        >"$OUT/ncu-fp8-raw.csv" 2>"$OUT/ncu-fp8.err"
    python3 scripts/ncu_stalls.py "$OUT/ncu-fp8-raw.csv" --top 10 >"$OUT/fp8prof-stalls.txt" 2>&1
    "$ncu_bin" --clock-control none --kernel-name regex:k_gemm_fp8 --launch-skip 2 --launch-count 1 \
        --section SourceCounters --page source --print-source sass --csv "${fp8_bench[@]}" \
        >"$OUT/ncu-fp8-sass.csv" 2>>"$OUT/ncu-fp8.err"
    note "fp8prof (rc $?): fp8prof-stalls.txt, ncu-fp8-sass.csv ($(wc -l <"$OUT/ncu-fp8-sass.csv") lines)"
fi
if has gemm; then
    ./build/nib bench gemm --json "$OUT/gemm.json" ${GEMM_ARGS:-} >"$OUT/gemm.log" 2>&1
    note "bench gemm (rc $?): $(tail -1 "$OUT/gemm.log")"
fi
if has ops; then
    ./build/nib bench ops --json "$OUT/ops.json" >>"$LOG" 2>&1
    note "bench ops (rc $?)"
fi
if has attn; then
    ./build/nib bench attn --json "$OUT/attn.json" ${ATTN_ARGS:-} >"$OUT/attn.log" 2>&1
    note "bench attn (rc $?): $(tail -1 "$OUT/attn.log")"
fi
if has attnprof; then
    # Nsight Compute on the attention lab's decode rows: the eager call and the first graph
    # calls of each (T, kv dtype) in ATTNPROF_T (default 32768) x ATTNPROF_KV (bf16,fp8,nvfp4);
    # every kernel of those calls (attention and split merge), details page + raw stall reasons
    ncu_bin=$(command -v ncu 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
    for kv in $(echo "${ATTNPROF_KV:-bf16,fp8,nvfp4}" | tr , ' '); do
        for t in $(echo "${ATTNPROF_T:-32768}" | tr , ' '); do
            "$ncu_bin" --clock-control none --kernel-name regex:k_attn --launch-count "${ATTNPROF_LAUNCHES:-4}" \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section SchedulerStats --csv --page details \
                ./build/nib bench attn --sections decode --t "$t" --kv "$kv" --reps 3 \
                >"$OUT/ncu-attn-$kv-t$t.csv" 2>"$OUT/ncu-attn-$kv-t$t.err"
            note "attnprof $kv T=$t (rc $?): $(grep -c '"k_attn' "$OUT/ncu-attn-$kv-t$t.csv") metric rows"
            "$ncu_bin" --clock-control none --kernel-name regex:k_attn --launch-count "${ATTNPROF_LAUNCHES:-4}" \
                --section WarpStateStats --section InstructionStats --page raw --csv \
                ./build/nib bench attn --sections decode --t "$t" --kv "$kv" --reps 3 \
                >"$OUT/ncu-attn-raw-$kv-t$t.csv" 2>>"$OUT/ncu-attn-$kv-t$t.err"
            python3 scripts/ncu_stalls.py "$OUT/ncu-attn-raw-$kv-t$t.csv" --top 8 >>"$OUT/attnprof-stalls.txt" 2>&1
            if [ "${ATTNPROF_SASS:-0}" = 1 ]; then
                "$ncu_bin" --clock-control none --kernel-name regex:k_attn_dec --launch-skip 3 --launch-count 1 \
                    --section SourceCounters --page source --print-source sass --csv \
                    ./build/nib bench attn --sections decode --t "$t" --kv "$kv" --reps 3 \
                    >"$OUT/ncu-attn-sass-$kv-t$t.csv" 2>>"$OUT/ncu-attn-$kv-t$t.err"
            fi
        done
    done
    (cd "$OUT" && tar czf attnprof.tgz ncu-attn-*.csv ncu-attn-*.err && rm -f ncu-attn-*.csv ncu-attn-*.err)
    grep -E "k_attn|cycles between|long_scoreboard|wait |barrier" "$OUT/attnprof-stalls.txt" | head -40 | tee -a "$LOG"
fi
CKPT=${TMPDIR:-/tmp}/nib-demo-pi05.safetensors
if has expertprof; then
    ncu_bin=$(command -v ncu 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
    [ -f "$CKPT" ] || ./build/nib demo >/dev/null 2>&1
    QP=${TMPDIR:-/tmp}/nib-demo-pi05-fast-prof.safetensors # pre-quantized: each replay pass loads it
    [ -f "$QP" ] || ./build/nib quantize "$CKPT" "$QP" --pi05 fast --force -q >>"$LOG" 2>&1
    xargs_=(--replay-mode application --app-replay-match grid --clock-control none --kernel-name regex:k_expert
            --launch-skip "${EXPERTPROF_SKIP:-5}" --launch-count 1)
    run_=(./build/nib bench pi05 --checkpoint "$QP" --preset fast --cams 2 --horizon 10 --reps 5)
    "$ncu_bin" "${xargs_[@]}" --section SpeedOfLight --section WarpStateStats --section InstructionStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --csv --page details "${run_[@]}" \
        >"$OUT/ncu-expert.csv" 2>"$OUT/ncu-expert.err"
    note "expertprof details (rc $?): $(grep -c '"k_expert' "$OUT/ncu-expert.csv") metric rows"
    "$ncu_bin" "${xargs_[@]}" --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
        "${run_[@]}" >"$OUT/ncu-expert-sass.csv" 2>>"$OUT/ncu-expert.err"
    note "expertprof source (rc $?): $(wc -l <"$OUT/ncu-expert-sass.csv") lines"
fi
if has demo; then
    ./build/nib demo >"$OUT/demo.log" 2>&1
    note "demo (rc $?): $(grep -E '^  (bf16|fast) ' "$OUT/demo.log" | tr -s ' ' | tr '\n' ';')"
fi
if has pi05; then
    ./build/nib bench pi05 --json "$OUT/pi05.json" ${PI05_ARGS:-} >"$OUT/pi05.log" 2>&1
    note "bench pi05 (rc $?): $(grep -E '^(bf16|fast) +2 +10 ' "$OUT/pi05.log" | tr -s ' ' | tr '\n' ';')"
fi
if has accuracy; then
    ./build/nib accuracy pi05 --json "$OUT/pi05-accuracy.json" >"$OUT/accuracy.log" 2>&1
    note "accuracy pi05 (rc $?): $(grep -E 'actions cosine' "$OUT/accuracy.log" | tr -s ' ' | tr '\n' ';')"
fi
if has pi05prof; then
    ncu_bin=$(command -v ncu 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
    [ -f "$CKPT" ] || ./build/nib demo >/dev/null 2>&1
    for pc in $(echo "${PI05PROF_CAMS:-2}" | tr , ' '); do
        IN=${TMPDIR:-/tmp}/nib-pi05-inputs-c$pc.safetensors
        python3 scripts/pi05_inputs.py "$IN" --cameras "$pc" --text 20 >/dev/null
        for pp in $(echo "${PI05PROF_PRESET:-fast}" | tr , ' '); do
            for ph in $(echo "${PI05PROF_HORIZON:-10}" | tr , ' '); do
                sfx=""; [ "$pp:$ph:$pc" != "fast:10:2" ] && sfx="-$pp-h$ph-c$pc"
                NIB_FUSED_STEP=${PI05PROF_FUSED:-0} "$ncu_bin" --clock-control none --cache-control none \
                    --metrics gpu__time_duration.sum --csv --page raw \
                    ./build/nib run pi05 --checkpoint "$CKPT" --inputs "$IN" --out "$OUT/pi05prof-actions$sfx.safetensors" \
                    --preset "$pp" --horizon "$ph" >"$OUT/ncu-pi05$sfx.csv" 2>"$OUT/ncu-pi05$sfx.err"
                rc=$?
                python3 scripts/ncu_timeline.py "$OUT/ncu-pi05$sfx.csv" --first 40 --list prefix:${PI05PROF_LIST:-40} \
                    >"$OUT/ncu-pi05$sfx.txt" 2>&1
                note "pi05prof $pp H=$ph cams=$pc (rc $rc): $(head -1 "$OUT/ncu-pi05$sfx.txt")"
                grep -E '^(vision|prefix|expert) ' "$OUT/ncu-pi05$sfx.txt" | tee -a "$LOG"
            done
        done
    done
fi
if has ktrace; then
    if make -j"$JOBS" BUILD=build-kt NIB_LAB_NVCCFLAGS="-DNIB_KTRACE=1 ${KTRACE_FLAGS:-}" >>"$LOG" 2>&1; then
        IFS=';' read -r -a kenvs <<<"${KTRACE_ENVS:-NIB_OVERLAP=0;NIB_OVERLAP=0 NIB_FP8_GEGLU_PDL=1;;NIB_FP8_GEGLU_PDL=1}"
        for i in "${!kenvs[@]}"; do
            kf=${TMPDIR:-/tmp}/nib-ktrace-$i.txt
            # shellcheck disable=SC2086 # the environment's words are VAR=VALUE assignments
            env ${kenvs[$i]} NIB_KTRACE="$kf" ./build-kt/nib bench pi05 --preset fast --cams "${KTRACE_CAMS:-1}" \
                --horizon "${KTRACE_HORIZON:-10}" --reps 30 >"$OUT/ktrace-$i.bench.log" 2>&1
            rc=$?
            # shellcheck disable=SC2086 # KTRACE_ARGS: the script's options, word-split on purpose
            python3 scripts/ktrace.py "$kf" ${KTRACE_ARGS:---blocks --detail} >"$OUT/ktrace-$i.txt" 2>&1
            note "ktrace $i '${kenvs[$i]}' (bench rc $rc): $(grep -E '^fast ' "$OUT/ktrace-$i.bench.log" | tr -s ' ' |
                cut -d' ' -f1-7); $(grep -E 'gg run|sum of spans' "$OUT/ktrace-$i.txt" | tr -s ' ')"
        done
    else
        note "ktrace: the stamped build FAILED (see gpu-check.log)"
    fi
fi
if has experttrace; then
    # the persistent expert kernel's own clock: per phase of a layer, work and barrier time, and
    # per-CTA segments (NIB_FUSED_STEP=1 NIB_EXPERT_TRACE=1; fast, 2 cameras, H = 10)
    NIB_FUSED_STEP=1 NIB_EXPERT_TRACE=1 ./build/nib bench pi05 --preset fast --cams 2 --horizon 10 --reps 50 \
        >"$OUT/experttrace.log" 2>&1
    note "experttrace (rc $?): experttrace.log"
    grep -iE 'phase|barrier|segment|qkv|attn|merge|gate|down' "$OUT/experttrace.log" | head -40 | tee -a "$LOG"
fi
if has plansearch; then
    python3 scripts/plan_search.py --time-budget "${PLANSEARCH_BUDGET:-400}" --json "$OUT/plan-search.json" \
        ${PLANSEARCH_ARGS:-} >"$OUT/plansearch.log" 2>&1
    note "plansearch (rc $?): $(tail -1 "$OUT/plansearch.log")"
fi
if has load; then
    [ -f "$CKPT" ] || ./build/nib demo >/dev/null 2>&1
    Q=${TMPDIR:-/tmp}/nib-demo-pi05-fast.safetensors
    IN=${TMPDIR:-/tmp}/nib-pi05-inputs.safetensors
    tq=$(date +%s)
    ./build/nib quantize "$CKPT" "$Q" --pi05 fast --force -q >"$OUT/quantize.log" 2>&1
    note "quantize --pi05 fast (rc $?, $(( $(date +%s) - tq )) s): $(tail -1 "$OUT/quantize.log")"
    python3 scripts/pi05_inputs.py "$IN" --cameras 2 --text 20 >/dev/null
    ./build/nib run pi05 --checkpoint "$Q" --inputs "$IN" --out "$OUT/actions.safetensors" --preset fast --timing \
        >"$OUT/load.log" 2>&1
    note "load (rc $?): $(grep -E 'loaded|file to first' "$OUT/load.log" | tr '\n' ' ')"
    rm -f "$Q"
fi
if has overlap; then
    [ -f "$CKPT" ] || ./build/nib demo >/dev/null 2>&1
    ab_row() { # label env preset cams H
        local r
        r=$(env $2 ./build/nib bench pi05 --checkpoint "$CKPT" --reps 100 --preset "$3" --cams "$4" --horizon "$5" \
            2>>"$OUT/overlap.log" | tee -a "$OUT/overlap.log" | grep -E "^$3 " | head -1 | tr -s ' ')
        echo "$1 ($2): $r" | tee -a "$OUT/overlap-ab.txt"
    }
    for rep in $(seq 1 "${OVERLAP_REPS:-2}"); do
        for row in "bf16 2 10" "fast 3 50"; do
            ab_row "per-op off" NIB_OVERLAP_OPS=0 $row
            ab_row "per-op on" NIB_OVERLAP_OPS=1 $row
        done
        for row in "fast 1 10" "fast 2 10" "fast 3 10"; do
            ab_row "kernel beside" "NIB_FUSED_STEP=1 NIB_OVERLAP_FIRST_OPS=0" $row
            ab_row "per-op beside" "NIB_FUSED_STEP=1 NIB_OVERLAP_FIRST_OPS=1" $row
        done
    done
    note "overlap A/B: overlap-ab.txt ($(wc -l <"$OUT/overlap-ab.txt") rows)"
fi
note "total $(( $(date +%s) - t0 )) s"
echo
echo "================ summary ================"
for s in "${summary[@]}"; do echo "$s"; done
if [ -f "$OUT/gemm.log" ]; then
    echo "---- gemm, M=1 and M=16 ----"
    grep -E "^ +[0-9]+ +[0-9]+ +(1|16) " "$OUT/gemm.log" | head -80
fi
