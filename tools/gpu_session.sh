#!/usr/bin/env bash
# Everything a GPU session needs, in one call: build for sm_90 with every core, run the whole test suite
# (GPU tests included), the self-check and the benchmarks. Logs and results go to $OUT (default ./gpu_out).
#   bash tools/gpu_session.sh [build] [test] [test-slow] [selfcheck] [bench] [bench-full] [sass]
#   (default: build test test-slow selfcheck bench sass)
# The device allows 10 minutes per call: build + test fit one (pytest-xdist, nproc - 2 workers sharing the
# GPU), test-slow + selfcheck + bench-full the next, issued while the machine is still warm (build kept).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/results"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
steps=${*:-build test test-slow selfcheck bench sass}
status=0
has() { [[ " $steps " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
if has build; then
  start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
  # libstdc++ must come from the system (a private static copy crashes when formatting numbers).
  nm -C torch_wmmae/_C*.so | grep -c " [TW] std::ostream& std::ostream::_M_insert<long>" | sed 's/^/private libstdc++ ostream symbols: /'

fi
if has sass; then
  python3 tools/sass_report.py --out "$OUT/sass.md" > /dev/null 2> "$OUT/sass.err" || { status=1; tail -5 "$OUT/sass.err"; }
  grep -E "sm90_kernel|corrected_gemm_kernel" "$OUT/sass.md" | cut -c1-160 | head -30
fi
# Files that need the GPU to themselves or a long compile: test_large (up to ~30 GB of GPU memory),
# test_cpp_api (builds a LibTorch program), test_multi_gpu (two GPUs; skipped on one).
slow=(tests/test_large.py tests/test_cpp_api.py tests/test_multi_gpu.py)
if has test; then
  start=$(date +%s)
  workers=()
  python3 -c "import xdist" 2>/dev/null && workers=(-n "$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))")
  # TEST_TIMEOUT (seconds): stop the run there and keep its log, so that a call's limit leaves a report.
  ${TEST_TIMEOUT:+timeout "$TEST_TIMEOUT"} python3 -m pytest -q -rs -p no:cacheprovider "${workers[@]}" tests "${slow[@]/#/--ignore=}" \
    > "$OUT/pytest.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -30; tail -3 "$OUT/pytest.log"
  echo "test: $(( $(date +%s) - start )) s"
fi
if has test-slow; then
  start=$(date +%s)
  python3 -m pytest -q -rs -p no:cacheprovider "${slow[@]}" > "$OUT/pytest_slow.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_slow.log" | head -30; tail -3 "$OUT/pytest_slow.log"
  echo "test-slow: $(( $(date +%s) - start )) s"
fi
if has selfcheck; then
  python3 -m torch_wmmae > "$OUT/selfcheck.log" 2>&1 || status=1
  tail -30 "$OUT/selfcheck.log"
fi
if has bench; then
  python3 benchmarks/bench_batched_outer.py --quick --out "$OUT/results" 2>&1 | tail -25 || status=1
  python3 benchmarks/bench_corrected_matmul.py --quick --out "$OUT/results" 2>&1 | tail -25 || status=1
  python3 benchmarks/bench_matrix_vector.py --out "$OUT/results" 2>&1 | tail -20 || status=1
fi
if has bench-full; then
  start=$(date +%s)
  python3 benchmarks/bench_batched_outer.py --out "$OUT/results" > "$OUT/bench_batched_outer.log" 2>&1 || status=1
  tail -16 "$OUT/bench_batched_outer.log"
  echo "bench_batched_outer: $(( $(date +%s) - start )) s"
  python3 benchmarks/bench_corrected_matmul.py --out "$OUT/results" > "$OUT/bench_corrected_matmul.log" 2>&1 \
    || status=1
  grep -E "^(1x|64x)" "$OUT/bench_corrected_matmul.log"; tail -2 "$OUT/bench_corrected_matmul.log"
  python3 benchmarks/bench_matrix_vector.py --out "$OUT/results" > "$OUT/bench_matrix_vector.log" 2>&1 || status=1
  echo "bench-full: $(( $(date +%s) - start )) s"
fi
exit $status
