#!/bin/sh
# run.sh NAME SECONDS MAX_LEN — one timed libFuzzer run of build-fuzz/fuzz_NAME (called by
# fuzz/fuzz.mk). The corpus build-fuzz/corpus/NAME grows across runs; seeds come from
# build-fuzz/seeds/NAME. Prints one summary line, appends it to build-fuzz/ledger.tsv with the
# CPU seconds the run used, and exits 1 on any crash / leak / timeout / OOM (the reproducer is
# in build-fuzz/artifacts/NAME/ and the log's tail is printed).
# FUZZ_INSTANCE=K runs another process on the same corpus (its own log; libFuzzer picks up
# the units the other processes add), to use more cores for one harness. FUZZ_EXTRA adds
# libFuzzer flags (e.g. "-fork=1 -ignore_crashes=1" to go on past a known crash).
set -u
name=$1 secs=$2 maxlen=$3
dir=${FUZZ_DIR:-build-fuzz}
tag=$name${FUZZ_INSTANCE:+.$FUZZ_INSTANCE}
bin=$dir/fuzz_$name corpus=$dir/corpus/$name seeds=$dir/seeds/$name
arts=$dir/artifacts/$name log=$dir/logs/$tag.log
mkdir -p "$corpus" "$seeds" "$arts" "$dir/logs"
dict=
[ -f "fuzz/$name.dict" ] && dict=-dict=fuzz/$name.dict
before=$(ls "$arts" | wc -l)
# -timeout: one input taking >10 s is a finding; -rss_limit_mb: so is a 2 GiB allocation
# (the readers are O(header) in memory). detect_leaks stays on (ASan's default).
# CPU seconds come from GNU time (Debian package "time", installed by scripts/setup.sh); without
# it the run still happens and the CPU column reads 0.
timer=
[ -x /usr/bin/time ] && timer="/usr/bin/time -f %U_%S_%e -o $dir/logs/$tag.time"
rm -f "$dir/logs/$tag.time"
$timer "$bin" -max_total_time="$secs" -max_len="$maxlen" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$arts/" $dict ${FUZZ_EXTRA:-} "$corpus" "$seeds" >"$log" 2>&1
rc=$?
after=$(ls "$arts" | wc -l)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
last=$(grep -E '^#[0-9]+' "$log" | tail -1)
cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
# fork mode (-fork=N) prints no final stats: take the count of its last status line
[ -z "$execs" ] && execs=$(echo "$last" | sed -n 's/^#\([0-9]*\).*/\1/p')
corp=$(ls "$corpus" | wc -l)
set -- $(tail -1 "$dir/logs/$tag.time" 2>/dev/null | tr _ ' ')
cpu=$(echo "${1:-0} ${2:-0}" | awk '{printf "%.0f", $1 + $2}')
wall=$(echo "${3:-0}" | awk '{printf "%.0f", $1}')
crashes=$((after - before))
[ $rc -ne 0 ] && [ $crashes -eq 0 ] && crashes=1
line="fuzz $tag: ${wall} s wall, ${cpu} s CPU, ${execs:-0} execs, cov ${cov:-?}, ft ${ft:-?}, corpus $corp, crashes $crashes"
echo "$line"
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$name" "$wall" \
    "$cpu" "${execs:-0}" "${cov:-}" "${ft:-}" "$corp" "$crashes" >>"$dir/ledger.tsv"
if [ $rc -ne 0 ]; then
    echo "fuzz $tag: FAILED (exit $rc); log $log; artifacts:" >&2
    ls -l "$arts" >&2
    tail -n 60 "$log" >&2
    exit 1
fi
exit 0
