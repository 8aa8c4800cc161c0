#!/usr/bin/env bash
# Fuzzes the wire decoders, the agent's dispatcher and the client's demultiplexer
# with cargo-fuzz (libFuzzer); the targets live in fuzz/ (see fuzz/Cargo.toml).
#
#   scripts/fuzz.sh --smoke          replay each committed corpus, then fuzz each
#                                    target for 20 s; any crash fails the run (CI)
#   scripts/fuzz.sh --long SECONDS   fuzz each target for SECONDS, one after the
#                                    other, and print the executions of each
#   scripts/fuzz.sh --merge          add to the committed corpus the inputs of
#                                    fuzz/work that reach new coverage
#   scripts/fuzz.sh ... TARGET...    only these targets
#
# Installs what is missing first: the nightly toolchain (cargo-fuzz needs it for
# the coverage instrumentation) and cargo-fuzz. One fuzzer runs at a time, in one
# process: no -jobs or -workers, so it never takes more than one core.
#
# New inputs go to fuzz/work/TARGET (ignored by git), never into the committed
# corpus; a crash leaves its input in fuzz/artifacts/TARGET. `--merge` keeps the
# few of them that add coverage.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(frame_decode request_decode agent_dispatch client_frames link_decode egress_parse)
SMOKE_SECS=20

usage() {
  echo "usage: $0 --smoke [TARGET...] | --long SECONDS [TARGET...] | --merge [TARGET...]" >&2
  exit 2
}

mode=${1:-}
case "$mode" in
  --smoke) secs=$SMOKE_SECS; shift ;;
  --long) [ $# -ge 2 ] || usage; secs=$2; shift 2 ;;
  --merge) secs=0; shift ;;
  *) usage ;;
esac
[ $# -gt 0 ] && TARGETS=("$@")

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz

# No sanitizer: the targets are safe Rust whose findings are panics, hangs and
# unbounded memory, which libFuzzer sees without one; ASan would halve the
# executions and double the build. Debug assertions on: overflow checks find
# arithmetic on wire values that release builds would silently wrap.
FUZZ=(cargo +nightly fuzz run --sanitizer none --debug-assertions)
# -timeout: an input that runs this long is a hang (the async targets bound their
# own waits at 10 s); -rss_limit_mb: a frame that makes a decoder allocate without
# bound is a finding too.
LIBFUZZER=(-timeout=30 -rss_limit_mb=2048 -print_final_stats=1)

cargo +nightly fuzz build --sanitizer none --debug-assertions

if [ "$mode" = --merge ]; then
  for target in "${TARGETS[@]}"; do
    mkdir -p "fuzz/work/$target"
    "${FUZZ[@]}" "$target" "fuzz/corpus/$target" "fuzz/work/$target" -- -merge=1 2>&1 |
      grep -E '^MERGE-OUTER: [0-9]+ new files' || true
  done
  exit 0
fi

declare -A SUMMARY
for target in "${TARGETS[@]}"; do
  corpus=fuzz/corpus/$target
  work=fuzz/work/$target
  mkdir -p "$work"
  if [ "$mode" = --smoke ]; then
    echo "fuzz: $target: replaying $(find "$corpus" -type f | wc -l) committed inputs"
    "${FUZZ[@]}" "$target" "$corpus" -- -runs=0 "${LIBFUZZER[@]}" >"$work.log" 2>&1 || {
      tail -n 60 "$work.log" >&2
      echo "fuzz: FAILED: $target crashed on its committed corpus (log: $work.log)" >&2
      exit 1
    }
  fi
  echo "fuzz: $target: fuzzing for ${secs}s"
  "${FUZZ[@]}" "$target" "$work" "$corpus" -- -max_total_time="$secs" "${LIBFUZZER[@]}" \
    >"$work.log" 2>&1 || {
    tail -n 60 "$work.log" >&2
    echo "fuzz: FAILED: $target crashed; the input is in fuzz/artifacts/$target (log: $work.log)" >&2
    exit 1
  }
  # agent_dispatch's scratch directories (one per fuzzer process, named after its
  # pid; a file when an input replaced it) outlive it: libFuzzer exits without
  # running destructors. Remove those whose fuzzer is gone (its pid is free or
  # reused by another program).
  for dir in "${TMPDIR:-/tmp}"/sandbox-fuzz-dispatch-*; do
    [ -e "$dir" ] || continue
    comm=$(cat "/proc/${dir##*-}/comm" 2>/dev/null || true)
    [ "$comm" = agent_dispatch ] || rm -rf "$dir"
  done
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work.log" | tail -n 1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work.log" | tail -n 1)
  SUMMARY[$target]="${runs:-?} executions in ${secs}s (${speed:-?}/s)"
  grep -E '^(#[0-9]+ *DONE|Done [0-9]+ runs)' "$work.log" | tail -n 1 || true
done

echo "fuzz: no crashes"
for target in "${TARGETS[@]}"; do
  printf 'fuzz: %-15s %s\n' "$target" "${SUMMARY[$target]}"
done
