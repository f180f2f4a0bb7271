#!/usr/bin/env bash
# setup.sh — install what nib needs to build and test on a fresh Debian machine.
# Needs: a C11 compiler, make, and for sanitizer/fuzz builds clang with its runtimes.
# The CUDA backend is built when nvcc is on PATH (or in /usr/local/cuda); without it nib
# builds CPU-only and GPU tests skip. Idempotent: installs only what is missing.
set -euo pipefail
need=()
command -v make >/dev/null 2>&1 || need+=(make)
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v clang >/dev/null 2>&1 || need+=(clang)
[ -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ] || \
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
command -v git >/dev/null 2>&1 || need+=(git)
[ -x /usr/bin/time ] || need+=(time)   # GNU time: CPU seconds of fuzz runs (fuzz/run.sh)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "setup: installing ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "setup: nvcc found: the CUDA backend (sm_90a) will be built"
else
    echo "setup: no nvcc: building the CPU reference backend only (GPU tests will skip)"
fi
