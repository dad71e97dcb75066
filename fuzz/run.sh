#!/usr/bin/env bash
# Fuzzes one target for a bounded time, one process at a time, with the memory, time and
# hang limits of docs/reliability.md, going on past known failures (their inputs land in
# fuzz/artifacts/TARGET/; triage them with `kiln-fuzz triage`). Needs the nightly
# toolchain and cargo-fuzz. Usage: fuzz/run.sh TARGET SECONDS [EXTRA_CORPUS_DIR]
set -euo pipefail
cd "$(dirname "$0")"
target=$1 seconds=$2 extra=${3:-}
case $target in npy_read) max_len=65536 ;; *) max_len=1048576 ;; esac
mkdir -p "corpus/$target"
exec cargo +nightly fuzz run -O -a -s none "$target" "corpus/$target" ${extra:+"$extra"} -- \
  -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
  -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -max_len=$max_len \
  -max_total_time="$seconds" -print_final_stats=1
