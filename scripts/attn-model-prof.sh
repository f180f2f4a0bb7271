#!/bin/bash
# attn-model-prof.sh — Nsight Compute on the attention kernels of one `nib run pi05` call (fast, 2 cameras,
# 20 text tokens, H = 10): the SigLIP kernel (k_attn with head_dim 80) and the Gemma prefix's wgmma kernel
# (k_attn_wg), each one launch (layer ATTN_PROF_LAYER, default 3) inside the model rather than the lab.
# Writes under $OUT: ncu-<kind>.csv (details: speed of light, warp states, instruction mix, scheduler,
# memory) and ncu-<kind>-sass.csv (per-SASS-instruction stall samples). Needs build/nib and the demo
# checkpoint (made here if missing). Run on the GPU machine after `make`.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
ncu_bin=$(command -v ncu 2>/dev/null || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
CKPT=${TMPDIR:-/tmp}/nib-demo-pi05.safetensors
IN=${TMPDIR:-/tmp}/nib-pi05-inputs-c2.safetensors
[ -f "$CKPT" ] || ./build/nib demo >/dev/null 2>&1
python3 scripts/pi05_inputs.py "$IN" --cameras 2 --text 20 >/dev/null
layer=${ATTN_PROF_LAYER:-3}
# ATTN_PROF_KINDS (default "siglip gemma") picks the kinds; ATTN_PROF_SIGLIP_RX overrides the SigLIP kernel's
# name pattern (e.g. 'regex:k_attn_wgs' with NIB_ATTN_D80=wgs2 in the environment for the wgmma lab variant)
for kind in ${ATTN_PROF_KINDS:-siglip gemma}; do
    if [ $kind = siglip ]; then rx=${ATTN_PROF_SIGLIP_RX:-'regex:k_attn<.int.0, .int.80'}; else rx='regex:k_attn_wg<'; fi
    common=(--clock-control none --kernel-name-base demangled --kernel-name "$rx" --launch-skip "$layer" --launch-count 1)
    run=(./build/nib run pi05 --checkpoint "$CKPT" --inputs "$IN" --out "$OUT/actions-$kind.safetensors" --preset fast)
    NIB_FUSED_STEP=0 "$ncu_bin" "${common[@]}" --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section InstructionStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --csv --page details "${run[@]}" >"$OUT/ncu-$kind.csv" 2>"$OUT/ncu-$kind.err"
    echo "== $kind details (rc $?): $(grep -c . "$OUT/ncu-$kind.csv") lines"
    NIB_FUSED_STEP=0 "$ncu_bin" "${common[@]}" --section WarpStateStats --section SourceCounters \
        --page source --print-source sass --csv "${run[@]}" >"$OUT/ncu-$kind-sass.csv" 2>>"$OUT/ncu-$kind.err"
    echo "== $kind source (rc $?): $(grep -c . "$OUT/ncu-$kind-sass.csv") lines"
done
