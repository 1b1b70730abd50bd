#!/usr/bin/env bash
# One command for a GPU machine (issue 29, issue 41 point 4): the CUDA tests, the GPT-2 throughput
# benchmark and the Llama LoRA one, with a log and a JSON of figures written to OUTDIR.
#
#   tests/gpu/run_on_gpu.sh OUTDIR [--quick] [--dry-run] [--sizes 124m] [--rounds 1]
#                           [--batch 16] [--sides loom,manual,hf,hf_compile,loom_deterministic,loom_unchunked] [--budget 300]
#                           [--side-timeout 180] [--lora-sizes 1b] [--lora-sides loom,hf,hf_compile,loom_unchunked]
#                           [--lora-batch 8] [--lora-block 2048] [--lora-steps 30]
#
#   (default)  run the GPU tests, each under a timeout, then benchmarks/gpu_gpt/run.py for each
#              size: loom, the hand-written loop, transformers.Trainer and Trainer with
#              torch.compile, interleaved, loom under --deterministic (its cost: its step
#              time over loom's; issue 41 point 6) and loom with --chunked_lm_loss false (whether
#              the chunked loss, the default at this size, wins; point 2). A loom side took 6 s
#              on the H100 of 2026-11-25. A side that would start after --budget seconds is
#              skipped (and listed), and one side may run --side-timeout seconds, so the
#              whole run stays within 8 minutes (budget + side timeout), which leaves a
#              15-minute device allowance room for the machine's start and a second run. The
#              H100 run of 2026-11-25 spent 274 s on the tests, 124m and 350m (~140 s of it
#              350m), so the default is 124m alone (--sizes 124m,350m adds it). Then, within the same
#              budget, the Llama LoRA case (run.py --model llama_lora): a 1.1B Llama (TinyLlama's
#              shape) with PEFT's default adapter, bf16, packed windows of --lora-block tokens,
#              loom against transformers.Trainer + peft with and without torch.compile
#              (--lora-sizes none skips it).
#   --quick    the tests only.
#   --dry-run  here or in CI (no GPU): build the same two targets, check that the test binary
#              starts and skips (exit 77: no CUDA device), and run the benchmark's CPU smoke
#              (a tiny GPT-2, loom, hand-written and transformers.Trainer sides; a tiny Llama
#              LoRA, loom and transformers.Trainer + peft sides).
#
# On the GPU machine the binaries come prebuilt from this machine (`make build bench-build` makes CUDA
# builds: the torch wheel is +cu130) and run against that machine's torch through
# LD_LIBRARY_PATH; carry build/tests/loom_gpu_tests and build/benchmarks/gpu_gpt with the tree.
# Where they are missing the script builds only those targets (that needs the dependencies
# `make deps` installs; see docs/building.md, "On a GPU machine").
#
# OUTDIR gets run_on_gpu.log (everything printed), figures.json (device, versions, each test's
# status and seconds, every benchmark run and the medians of both cases; a run's "model" says
# which) and bench.json / bench_llama_lora.json (run.py's reports).
# Exit status: 0 when every test passed (or skipped, in --dry-run) and every benchmark side ran.

set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 2; }  # the comment above
out="" quick=0 dry=0 sizes=124m rounds=1 batch=16 sides=loom,manual,hf,hf_compile,loom_deterministic,loom_unchunked budget=300 side_timeout=180
lora_sizes=1b lora_sides=loom,hf,hf_compile,loom_unchunked lora_batch=8 lora_block=2048 lora_steps=30
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --dry-run) dry=1 ;;
    --sizes) sizes=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --batch) batch=$2; shift ;;
    --sides) sides=$2; shift ;;
    --budget) budget=$2; shift ;;
    --side-timeout) side_timeout=$2; shift ;;
    --lora-sizes) lora_sizes=$2; shift ;;
    --lora-sides) lora_sides=$2; shift ;;
    --lora-batch) lora_batch=$2; shift ;;
    --lora-block) lora_block=$2; shift ;;
    --lora-steps) lora_steps=$2; shift ;;
    -h|--help) usage ;;
    -*) echo "run_on_gpu.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$out" ] || { echo "run_on_gpu.sh: one OUTDIR, got '$out' and '$1'" >&2; exit 2; }; out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "run_on_gpu.sh: OUTDIR is required" >&2; usage; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
log=$out/run_on_gpu.log
: >"$log"
exec > >(tee -a "$log") 2>&1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "== [run_on_gpu $(elapsed)s] $*"; }

# The Python that holds torch: the project's venv here, the machine's python3 there.
py=${LOOM_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py=$root/.venv/bin/python; else py=$(command -v python3); fi
fi
torch_lib=$("$py" "$root/tests/gpu/device_info.py" lib) || {
  echo "run_on_gpu.sh: $py cannot import torch"; exit 1; }
export LD_LIBRARY_PATH=$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$py" "$root/tests/gpu/device_info.py" device >"$out/device.json"
say "device: $(cat "$out/device.json")"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv

build=${LOOM_BUILD_DIR:-$root/build}  # the build folder (CTest passes its own)
tests_bin=$build/tests/loom_gpu_tests
bench_bin=$build/benchmarks/gpu_gpt
if [ $dry -eq 1 ] || [ ! -x "$tests_bin" ] || [ ! -x "$bench_bin" ]; then
  if [ ! -f "$build/build.ninja" ]; then
    say "configuring build/ (the binaries are missing)"
    if [ "$build" = "$root/build" ] && [ -x "$root/.venv/bin/python" ]; then make -C "$root" build/build.ninja || exit 1
    else
      cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_PYTHON="$py" \
        -DTORCH_CUDA_ARCH_LIST=9.0 || { echo "run_on_gpu.sh: configure failed; see docs/building.md, 'On a GPU machine'"; exit 1; }
    fi
  fi
  say "building loom_gpu_tests and gpu_gpt"
  cmake --build "$build" --target loom_gpu_tests gpu_gpt || exit 1
fi

# The tests: each doctest case of loom_gpu_tests in its own process under a timeout, then
# the sharding case again under torchrun. Exit 77 means no CUDA device (skipped).
export LOOM_SOURCE_DIR=$root
export LOOM_TEST_TMP=${LOOM_TEST_TMP:-$(mktemp -d /tmp/loom_gpu_tests.XXXXXX)}
tests_json=$out/tests.jsonl
: >"$tests_json"
failed=0
run_test() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s) rc
  say "test: $name"
  timeout -k 10 "$limit" "$@"
  rc=$?
  local status=passed
  case $rc in 0) ;; 77) status=skipped ;; 124|137) status=timeout; failed=1 ;; *) status=failed; failed=1 ;; esac
  [ $dry -eq 1 ] && [ $rc -ne 77 ] && { status="failed (--dry-run expects exit 77: no CUDA device)"; failed=1; }
  say "test: $name: $status (exit $rc, $(( $(date +%s) - t0 )) s)"
  "$py" -c 'import json, sys; print(json.dumps({"test": sys.argv[1], "status": sys.argv[2], "exit": int(sys.argv[3]), "seconds": int(sys.argv[4])}))' \
    "$name" "$status" "$rc" "$(( $(date +%s) - t0 ))" >>"$tests_json"
}

if [ $dry -eq 1 ]; then
  # CPU-only even on a GPU machine: no device visible, so the binary must skip (exit 77).
  CUDA_VISIBLE_DEVICES= run_test "loom_gpu_tests (no GPU visible)" 120 "$tests_bin"
else
  # Each case by its name up to the first comma (doctest splits filters at commas), plus '*'.
  mapfile -t cases < <("$tests_bin" --list-test-cases --no-version 2>/dev/null |
                       grep -v -e '^\[doctest\]' -e '^====' -e '^$')
  [ ${#cases[@]} -gt 0 ] || { say "loom_gpu_tests listed no test cases"; failed=1; }
  for c in "${cases[@]}"; do run_test "$c" 300 "$tests_bin" "--test-case=${c%%,*}*" --duration=true; done
  run_test "every sharding policy under torchrun" 240 "$tests_bin" "--under-torchrun=$py"
fi

# The benchmark.
bench_failed=0
if [ $quick -eq 0 ]; then
  if [ $dry -eq 1 ]; then
    say "benchmark CPU smoke (tiny GPT-2)"
    CUDA_VISIBLE_DEVICES= "$py" "$root/benchmarks/gpu_gpt/run.py" --bench "$bench_bin" --python "$py" --device cpu --sizes tiny --rounds 1 \
      --sides loom,manual,hf,loom_deterministic,loom_unchunked --batch 2 --block_size 64 --max_steps 4 --warmup 1 --timeout 300 \
      --json "$out/bench.json" || bench_failed=1
    say "benchmark CPU smoke (tiny Llama LoRA)"
    CUDA_VISIBLE_DEVICES= "$py" "$root/benchmarks/gpu_gpt/run.py" --model llama_lora --bench "$bench_bin" --python "$py" \
      --device cpu --sizes tiny --rounds 1 --sides loom,hf,loom_unchunked --batch 2 --block_size 64 --max_steps 3 --warmup 1 \
      --timeout 300 --json "$out/bench_llama_lora.json" || bench_failed=1
  else
    say "benchmark: sizes $sizes, sides $sides, batch $batch, $rounds round(s); nothing starts after ${budget}s"
    "$py" "$root/benchmarks/gpu_gpt/run.py" --bench "$bench_bin" --device cuda --sizes "$sizes" \
      --rounds "$rounds" --sides "$sides" --batch "$batch" --timeout "$side_timeout" \
      --deadline $(( start + budget )) --json "$out/bench.json" || bench_failed=1
    if [ -n "$lora_sizes" ] && [ "$lora_sizes" != none ]; then
      say "benchmark: Llama LoRA, sizes $lora_sizes, sides $lora_sides, batch $lora_batch x $lora_block tokens, $lora_steps steps"
      "$py" "$root/benchmarks/gpu_gpt/run.py" --model llama_lora --bench "$bench_bin" --device cuda --sizes "$lora_sizes" \
        --rounds "$rounds" --sides "$lora_sides" --batch "$lora_batch" --block_size "$lora_block" \
        --max_steps "$lora_steps" --warmup 10 --timeout "$side_timeout" \
        --deadline $(( start + budget )) --json "$out/bench_llama_lora.json" || bench_failed=1
    fi
  fi
fi

"$py" - "$out" "$failed" "$bench_failed" "$(elapsed)" <<'EOF'
import json, os, sys
out, failed, bench_failed, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
figures = {"device": json.load(open(os.path.join(out, "device.json"))),
           "tests": [json.loads(l) for l in open(os.path.join(out, "tests.jsonl")) if l.strip()],
           "tests_failed": bool(failed), "benchmark_failed": bool(bench_failed), "wall_seconds": seconds}
bench = os.path.join(out, "bench.json")
if os.path.exists(bench):
    figures["benchmark"] = json.load(open(bench))
# The Llama LoRA case's report joins it: its runs (each with "model": "llama_lora", "size",
# "mode", "mfu"), failures and skips appended, its medians under "llama_lora/SIZE".
lora = os.path.join(out, "bench_llama_lora.json")
if os.path.exists(lora):
    extra = json.load(open(lora))
    merged = figures.setdefault("benchmark", {"runs": [], "failures": [], "skipped": [], "medians": {}})
    for k in ("runs", "failures", "skipped"):
        merged.setdefault(k, []).extend(extra.get(k, []))
    merged.setdefault("medians", {}).update(extra.get("medians", {}))
json.dump(figures, open(os.path.join(out, "figures.json"), "w"), indent=1)
EOF
say "done in $(elapsed)s: tests $([ $failed -eq 0 ] && echo passed || echo FAILED), benchmark $([ $bench_failed -eq 0 ] && echo ran || echo FAILED); $out/figures.json"
[ $failed -eq 0 ] && [ $bench_failed -eq 0 ]
