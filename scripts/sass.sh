#!/usr/bin/env bash
# sass.sh — the SASS of nib's CUDA kernels without a GPU: compiles one .cu to a cubin for the
# project's architecture and disassembles it with nvdisasm, then prints, per kernel whose name
# matches PATTERN, its instruction count and the opcode mix of its busiest blocks (the ones
# with the most HMMA instructions: the main loops).
#
#   scripts/sass.sh ops/cuda/gemm_lowbit.cu 'k_gemm_lowbitILi2ELi1E' [blocks]
#   SASS_OUT=/tmp/x.sass scripts/sass.sh ...   (also keep the full listing)
#   SASS_NVCCFLAGS=-DNIB_GEMM_LAB_DECODE=1 scripts/sass.sh ...   (a lab build's compile flags)
#
# nvdisasm comes with a full CUDA toolkit; where the toolkit here has none (only nvcc and
# ptxas), `pip install nvidia-cuda-nvdisasm` provides it and this script finds it.
set -euo pipefail
src=${1:?usage: scripts/sass.sh FILE.cu [PATTERN] [BLOCKS]}
pat=${2:-.}
nblocks=${3:-2}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
ARCH=${CUDA_ARCH:-sm_90a}
nvd=${NVDISASM:-}
if [ -z "$nvd" ]; then
    if command -v nvdisasm >/dev/null; then nvd=$(command -v nvdisasm)
    elif [ -x "$CUDA_HOME/bin/nvdisasm" ]; then nvd=$CUDA_HOME/bin/nvdisasm
    else
        for d in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
            for c in "$d"/cu*/bin/nvdisasm "$d"/cuda_nvdisasm/bin/nvdisasm; do [ -x "$c" ] && nvd=$c && break 2; done
        done
    fi
fi
[ -n "$nvd" ] || { echo "sass.sh: no nvdisasm (set NVDISASM, or: pip install nvidia-cuda-nvdisasm)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$NVCC" -O3 -std=c++17 --expt-relaxed-constexpr -arch="$ARCH" -I. -Iinclude -DNIB_HAVE_CUDA=1 -lineinfo -cubin ${SASS_NVCCFLAGS:-} \
    -o "$tmp/k.cubin" "$src"
"$nvd" -c "$tmp/k.cubin" >"$tmp/k.sass"
[ -n "${SASS_OUT:-}" ] && cp "$tmp/k.sass" "$SASS_OUT"
grep -oE '^\.text\.[^:]+' "$tmp/k.sass" | sed 's/^\.text\.//' | grep -E -- "$pat" | while read -r fn; do
    python3 "$(dirname "$0")/sass_blocks.py" "$tmp/k.sass" "$fn" "$nblocks"
done
