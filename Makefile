# nib — one boring build.
#   make              library (build/libnib.a, build/libnib.so), CLI (build/nib), tests (build/nib_tests)
#   make test         run every test; ends with "N passed, N failed, N skipped"
#   make san-test     CPU tests under ASan+UBSan (build-san/, CPU-only)
#   make bench        the kernel lab (needs a GPU)
#   make fuzz         libFuzzer harnesses (clang), FUZZ_SECONDS per harness, FUZZ_JOBS at once
#   make lint         scripts/lint.sh: unchecked CUDA/cuBLAS calls and launches, exit/abort in lib
#   scripts/sanitize.sh  compute-sanitizer over the tests (GPU machine), with its negative control
# Knobs: NO_CUDA=1 (CPU-only), CUDA_ARCH=sm_90a, CUDA_HOME=/usr/local/cuda, BUILD=build,
#        SAN=1 (sanitizers), OPT=-O2,
#        NIB_NEGATIVE_CONTROL=1 (the out-of-bounds test kernel of scripts/sanitize.sh)

BUILD     ?= build
CC        ?= cc
OPT       ?= -O2
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= sm_90a
CUDA_ARCH_NUM := $(patsubst sm_%,%,$(CUDA_ARCH))

NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
ifeq ($(NO_CUDA),1)
  HAVE_CUDA :=
else ifeq ($(strip $(NVCC)),)
  HAVE_CUDA :=
else
  HAVE_CUDA := 1
endif

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unused-function -Wno-format-truncation
CFLAGS  += -std=c11 $(OPT) -g -fPIC $(WARN) -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L \
           -I. -Iinclude -MMD -MP
LDLIBS  := -lm -lpthread -ldl

ifeq ($(SAN),1)
  CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=address,undefined
endif

# ---- sources ---------------------------------------------------------------------------
LIB_SRC  := $(wildcard base/*.c formats/*.c io/*.c ops/*.c ops/ref/*.c runtime/*.c models/*.c)
CLI_SRC  := $(filter-out cli/main.c,$(wildcard cli/*.c))
TEST_SRC := $(wildcard tests/*.c)
CU_SRC   := $(wildcard ops/cuda/*.cu runtime/*.cu)

ifeq ($(HAVE_CUDA),1)
  CFLAGS    += -DNIB_HAVE_CUDA=1 -isystem $(CUDA_HOME)/include
  NVCCFLAGS ?= -O3 -std=c++17 -lineinfo -gencode=arch=compute_$(CUDA_ARCH_NUM),code=$(CUDA_ARCH) \
               --expt-relaxed-constexpr -Xcompiler -Wall,-Wextra,-Werror,-fPIC -Werror all-warnings \
               -DNIB_HAVE_CUDA=1 -I. -Iinclude -MMD -MP
  # lab builds only (a separate BUILD directory): e.g. -DNIB_GEMM_LAB_DECODE=2 (ops/cuda/gemm_lowbit.cuh)
  NVCCFLAGS += $(NIB_LAB_NVCCFLAGS)
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
  CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/%.o)
else
  CU_OBJ    :=
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_OBJ)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

LIB   := $(BUILD)/libnib.a
SOLIB := $(BUILD)/libnib.so
NIB   := $(BUILD)/nib
TESTS := $(BUILD)/nib_tests

.PHONY: all test san-test bench clean fuzz lint info
all: $(LIB) $(SOLIB) $(NIB) $(TESTS)

info:
	@echo "CUDA backend: $(if $(HAVE_CUDA),yes ($(NVCC), $(CUDA_ARCH)),no)"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# The shared library: include/nib.h's API for programs and python/nib.py (ctypes)
$(SOLIB): $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $(LIB_OBJ) $(LDLIBS)

$(NIB): $(BUILD)/cli/main.o $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(BUILD)/cli/main.o $(CLI_OBJ) $(LIB) $(LDLIBS)

# Tests link the CLI command objects too, so CLI exit codes and messages are testable.
$(TESTS): $(TEST_OBJ) $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(CLI_OBJ) $(LIB) $(LDLIBS)

test: $(TESTS) $(NIB) $(SOLIB)
	./$(TESTS) $(T)

san-test:
	$(MAKE) BUILD=build-san SAN=1 NO_CUDA=1 OPT=-O1 test

bench: $(NIB)
	./$(NIB) bench gemm $(BENCH_ARGS)

# fuzz/fuzz.mk builds with clang into build-fuzz/ (independent of BUILD) and runs FUZZ_JOBS
# harnesses at a time; the corpus in build-fuzz/corpus/ grows across runs. docs/fuzzing.md.
fuzz:
	$(MAKE) -f fuzz/fuzz.mk -j$(or $(FUZZ_JOBS),2) FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60)

lint:
	bash scripts/lint.sh

# Negative control of scripts/sanitize.sh (CUDA builds): tests/negative_control_gpu.cu is linked
# into the tests; `make NIB_NEGATIVE_CONTROL=1` compiles its deliberate out-of-bounds write
# (use a separate BUILD dir: the flag is not tracked). tests/test_negative_control_gpu.c runs it.
ifeq ($(HAVE_CUDA),1)
NEGCTL_OBJ := $(BUILD)/tests/negative_control_gpu.o
TEST_OBJ   += $(NEGCTL_OBJ) $(BUILD)/tests/fp4_layout_check.o $(BUILD)/tests/fp8_quot_check.o $(BUILD)/tests/tanh_approx_check.o
$(TESTS): $(NEGCTL_OBJ) $(BUILD)/tests/fp4_layout_check.o $(BUILD)/tests/fp8_quot_check.o $(BUILD)/tests/tanh_approx_check.o
ifeq ($(NIB_NEGATIVE_CONTROL),1)
$(NEGCTL_OBJ): NVCCFLAGS += -DNIB_NEGATIVE_CONTROL=1
endif
endif

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
