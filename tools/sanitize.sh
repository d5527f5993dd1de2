#!/usr/bin/env bash
# Runs NVIDIA compute-sanitizer over the CUDA tests, one tool after the other (issue #6):
#   compute-sanitizer --tool TOOL --error-exitcode 1 --print-limit 100 --target-processes all --show-backtrace yes|no \
#       python -m pytest -q -x <selection>
# and writes, into $OUT (default ./sanitizer_out), one log per tool (sanitize_TOOL.log) and summary.md
# (tool, tests run, errors reported, exit code, duration, GPU).
#
#   bash tools/sanitize.sh                         # every tool, default selections
#   SANITIZE_TOOLS=memcheck bash tools/sanitize.sh # one tool (racecheck and initcheck are much slower)
#   bash tools/sanitize.sh tests/test_batched_outer.py -k fp16   # extra pytest arguments, appended
#   SANITIZE_COMMAND="build/cpp/test_cpp_api" bash tools/sanitize.sh   # a program instead of pytest
#
# Environment:
#   SANITIZE_TOOLS              tools, in order (default: "memcheck synccheck racecheck initcheck")
#   SANITIZE_SELECTION          pytest selection for every tool (shell words, quotes allowed); default below
#   SANITIZE_SELECTION_<TOOL>   the selection of one tool, e.g. SANITIZE_SELECTION_RACECHECK
#   SANITIZE_TIMEOUT            seconds per tool (default 1800); SANITIZE_TIMEOUT_<TOOL> for one tool
#   SANITIZE_EXTRA_ARGS         more compute-sanitizer arguments (e.g. "--leak-check full"; for racecheck over
#                               large problems "--kernel-name kns=wmmae_ops" checks only this package's kernels,
#                               not the tests' cuBLAS references, which took most of the time; not for
#                               initcheck: memory that the filtered-out kernels write counts as never written)
#   SANITIZE_COMMIT             the commit to name in the summary (default: git rev-parse HEAD)
#   SANITIZE_ALLOCATOR          uncached (default) or caching (see below)
#   SANITIZE_BACKTRACE          compute-sanitizer's --show-backtrace: yes by default, no with the caching
#                               allocator (see below)
#   SANITIZE_COMMAND            a command (shell words) to run under each tool instead of pytest, e.g. the C++
#                               API test program that tests/test_cpp_api.py builds (build it first)
#   TORCH_WMMAE_HYPOTHESIS_EXAMPLES  examples of tests/test_fuzz_batched_outer.py (default here: 5)
#   TORCH_WMMAE_STRESS_CALLS    calls of tests/test_stress.py when selected (default here: 100)
# The package must be built with its CUDA kernels first (e.g. bash tools/gpu_session.sh build).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

OUT_DIR=${OUT:-$PWD/sanitizer_out}
mkdir -p "$OUT_DIR"
TOOLS=${SANITIZE_TOOLS:-memcheck synccheck racecheck initcheck}
DEFAULT_TIMEOUT=${SANITIZE_TIMEOUT:-1800}

# The GPU tests that are fast enough under the sanitizer: no >2^31-element problems, no stress loop, no
# multi-process or multi-GPU tests, no C++ / device-library builds, no torch.compile (Inductor compiles in
# worker processes), no self-check subprocess.
FAST='-m gpu -k "not large and not stress and not multi_gpu and not ddp and not cpp_api and not device_library and not self_check and not compile and not cuda_graph"'
# racecheck and initcheck are one to two orders of magnitude slower (racecheck tracks every shared-memory
# access of the GEMM): tests/test_kernel_paths.py calls every kernel instantiation and run-time path once on
# small problems, plus the batched_outer, fragment_map and fuzz tests.
SLOW='tests/test_kernel_paths.py tests/test_batched_outer.py tests/test_fragment_map.py tests/test_fuzz_batched_outer.py -m gpu -k "not large and not compile and not cuda_graph and not opcheck"'

# initcheck reports reads of memory that the caching allocator handed out again as uninitialized (false
# positives); without caching every tensor is its own cudaMalloc, which also lets memcheck see overruns
# into neighbouring blocks. Used for every tool. CUDA-graph capture tests are left out: without the
# caching allocator an allocation during capture is a cudaMalloc, which capture forbids.
# SANITIZE_ALLOCATOR=caching keeps PyTorch's caching allocator instead, for the torch.compile and CUDA-graph
# tests (memcheck then sees overruns only past the end of a cached block).
# With backtraces on, compute-sanitizer keeps the Python frames of every kernel launch alive (torch's own
# launches too: measured on an H200 with torch.mm and torch.cuda._sleep, 1-2 frames per call, none with
# --show-backtrace no or without the sanitizer), and with them the tensors those frames refer to. Under the
# caching allocator that shows up as memory_allocated growing and as CUDA-graph trees finding tensors alive
# in their pool, so backtraces are off there; a report then names the kernel but not its host call stack.
if [ "${SANITIZE_ALLOCATOR:-uncached}" != caching ]; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  BACKTRACE=${SANITIZE_BACKTRACE:-yes}
else
  BACKTRACE=${SANITIZE_BACKTRACE:-no}
fi
export TORCH_WMMAE_HYPOTHESIS_EXAMPLES=${TORCH_WMMAE_HYPOTHESIS_EXAMPLES:-5}
export TORCH_WMMAE_STRESS_CALLS=${TORCH_WMMAE_STRESS_CALLS:-100}
export TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONUNBUFFERED=1

SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] && SANITIZER="${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"
if [ -z "$SANITIZER" ]; then
  echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin)" >&2
  exit 2
fi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU=${GPU:-unknown}

summary="$OUT_DIR/summary.md"
{
  echo "# compute-sanitizer over the CUDA tests"
  echo
  echo "GPU: $GPU; $("$SANITIZER" --version 2>/dev/null | grep -i version | head -1); $(date -u '+%Y-%m-%d %H:%M UTC'); commit ${SANITIZE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo
  echo "| tool | tests run | errors reported | exit code | duration | selection |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$summary"

status=0
for tool in $TOOLS; do
  upper=$(echo "$tool" | tr '[:lower:]' '[:upper:]')
  sel_var="SANITIZE_SELECTION_$upper"
  time_var="SANITIZE_TIMEOUT_$upper"
  case $tool in
    racecheck|initcheck) default_sel=$SLOW ;;
    *) default_sel=$FAST ;;
  esac
  selection=${!sel_var:-${SANITIZE_SELECTION:-$default_sel}}
  limit=${!time_var:-$DEFAULT_TIMEOUT}
  cmd_words=()
  if [ -n "${SANITIZE_COMMAND:-}" ]; then
    eval "cmd_words=($SANITIZE_COMMAND)"
    selection="$SANITIZE_COMMAND"
  else
    eval "cmd_words=(python -m pytest -q -x -p no:cacheprovider $selection)"
  fi
  log="$OUT_DIR/sanitize_$tool.log"
  echo "== $tool (timeout ${limit}s): ${cmd_words[*]} $*"
  start=$(date +%s)
  # shellcheck disable=SC2086  # SANITIZE_EXTRA_ARGS is a list of words
  timeout --signal=INT --kill-after=60 "$limit" \
    "$SANITIZER" --tool "$tool" --error-exitcode 1 --print-limit 100 --target-processes all --show-backtrace "$BACKTRACE" ${SANITIZE_EXTRA_ARGS:-} \
    "${cmd_words[@]}" "$@" > "$log" 2>&1
  rc=$?
  duration=$(( $(date +%s) - start ))
  # One "ERROR SUMMARY: N errors" line per sanitized process.
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+ error' "$log" | awk '{s += $3} END {print s + 0}')
  tests=$(grep -E '^(=+ )?([0-9]+ (passed|failed|skipped|deselected|xfailed|xpassed|errors?)|no tests ran).* in [0-9.]+s' "$log" \
          | tail -1 | sed -E 's/^=+ //; s/ =+$//')
  # A program's own "N passed, N failed" line (the C++ API test) where there is no pytest summary.
  [ -z "$tests" ] && tests=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
  [ -z "$tests" ] && tests="(no test summary)"
  case $rc in
    0) verdict="$rc" ;;
    124|137) verdict="$rc (timed out after ${limit}s)" ;;
    *) verdict="$rc" ;;
  esac
  [ "$rc" -ne 0 ] && status=1
  echo "| $tool | $tests | $errors | $verdict | ${duration} s | \`${selection//|/\\|} $*\` |" >> "$summary"
  echo "   $tool: exit $rc, $errors sanitizer errors, ${duration} s; $tests"
  if [ "$errors" -gt 0 ]; then
    grep -m 20 -E '^========= (Invalid|Error|Race|Uninitialized|Barrier|Program hit|Warning)' "$log" | sed 's/^/   /'
  fi
done

echo
cat "$summary"
exit $status
