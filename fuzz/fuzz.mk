# fuzz.mk — libFuzzer harnesses (clang, ASan + UBSan), their seed corpora and timed runs.
#
#   make fuzz                      every harness for FUZZ_SECONDS (60) each, FUZZ_JOBS (2) at once
#   make fuzz FUZZ_SECONDS=3600    longer runs; the corpus in build-fuzz/corpus/ grows across runs
#   make fuzz FUZZ_ONLY="json"     a subset;  make -f fuzz/fuzz.mk run-json   one harness
#   make -f fuzz/fuzz.mk build     build only; make -f fuzz/fuzz.mk info       list harnesses
#
# Each harness is one line below: HARNESS_<name> := the library sources it needs besides base/.
# fuzz/fuzz_<name>.c holds LLVMFuzzerTestOneInput; seeds come from fuzz/fuzz_seeds.c (directory
# build-fuzz/seeds/<name>/; a harness without seeds starts from an empty corpus) and
# fuzz/<name>.dict is used when it exists. Library sources are compiled directly with clang
# (CPU only, no CUDA), independent of the main build directory.
#
# Every run prints one line: "fuzz <name>: ... execs, cov ..., ft ..., corpus ..., crashes N",
# appends it to build-fuzz/ledger.tsv (CPU seconds included) and fails on any crash, leak,
# timeout or OOM, leaving the reproducer in build-fuzz/artifacts/<name>/.

HARNESS_safetensors := io/json.c io/safetensors.c
HARNESS_json        := io/json.c
HARNESS_qckpt       := io/json.c io/safetensors.c io/qcheckpoint.c formats/fp8.c formats/int4.c formats/mxfp4.c formats/nvfp4.c ops/gemm.c
HARNESS_config      := io/json.c io/safetensors.c io/qcheckpoint.c models/pi05_config.c ops/kvcache.c ops/gemm.c formats/fp8.c formats/int4.c formats/mxfp4.c formats/nvfp4.c

FUZZ_SECONDS ?= 60
FUZZ_MAX_LEN ?= 16384
FUZZ_CC      ?= clang
FUZZ_DIR     ?= build-fuzz
FUZZ_FLAGS   ?= -std=c11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-function \
                -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -I. -Iinclude \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
BASE_SRC     := $(wildcard base/*.c)
comma        := ,

HARNESSES := $(sort $(patsubst HARNESS_%,%,$(filter HARNESS_%,$(.VARIABLES))))
# a harness whose sources are not all in the tree yet is skipped (listed by `info`)
present    = $(and $(wildcard fuzz/fuzz_$(1).c),$(if $(filter-out $(wildcard $(HARNESS_$(1))),$(HARNESS_$(1))),,yes))
ACTIVE    := $(foreach h,$(HARNESSES),$(if $(call present,$(h)),$(h)))
# FUZZ_ONLY="json qckpt" runs a subset (CI uses it to leave out a harness with a known open bug)
RUN       := $(if $(FUZZ_ONLY),$(filter $(FUZZ_ONLY),$(ACTIVE)),$(ACTIVE))
BINS      := $(RUN:%=$(FUZZ_DIR)/fuzz_%)

.SECONDEXPANSION:
.PHONY: all build seeds info $(ACTIVE:%=run-%)
all: $(RUN:%=run-%)
build: $(BINS)

info:
	@echo "harnesses: $(HARNESSES)"; echo "active: $(ACTIVE)"; echo "run: $(RUN)"

$(FUZZ_DIR)/fuzz_%: fuzz/fuzz_%.c $(BASE_SRC) $$(HARNESS_$$*) Makefile fuzz/fuzz.mk
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(BASE_SRC) $(HARNESS_$*) -lm

# Seeds are regenerated each time (cheap, deterministic) with an ASan build of the generator.
$(FUZZ_DIR)/fuzz_seeds: fuzz/fuzz_seeds.c $(BASE_SRC) io/json.c io/safetensors.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(subst fuzzer$(comma),,$(FUZZ_FLAGS)) -o $@ $^ -lm

seeds: $(FUZZ_DIR)/fuzz_seeds
	@rm -rf $(FUZZ_DIR)/seeds && $(FUZZ_DIR)/fuzz_seeds $(FUZZ_DIR)/seeds

$(ACTIVE:%=run-%): run-%: $(FUZZ_DIR)/fuzz_% seeds
	@FUZZ_DIR=$(FUZZ_DIR) sh fuzz/run.sh $* $(FUZZ_SECONDS) $(FUZZ_MAX_LEN)
