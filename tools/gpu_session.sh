#!/usr/bin/env bash
# Everything a GPU session needs, in one call: build for sm_90 with every core, run the whole test suite
# (GPU tests included), the self-check and the benchmarks. Logs and results go to $OUT (default ./gpu_out).
#   bash tools/gpu_session.sh [build] [test] [selfcheck] [bench] [bench-full] [sass]   (default: all but bench-full)
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/results"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
steps=${*:-build test selfcheck bench sass}
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
if has test; then
  python3 -m pytest -q -rs tests > "$OUT/pytest.log" 2>&1 || status=1
  tail -40 "$OUT/pytest.log"
fi
if has selfcheck; then
  python3 -m torch_wmmae > "$OUT/selfcheck.log" 2>&1 || status=1
  tail -30 "$OUT/selfcheck.log"
fi
if has bench; then
  python3 benchmarks/bench_batched_outer.py --quick --out "$OUT/results" 2>&1 | tail -25 || status=1
  python3 benchmarks/bench_corrected_matmul.py --quick --out "$OUT/results" 2>&1 | tail -25 || status=1
fi
if has bench-full; then
  python3 benchmarks/bench_batched_outer.py --out "$OUT/results" 2>&1 | tail -25 || status=1
  python3 benchmarks/bench_corrected_matmul.py --out "$OUT/results" 2>&1 | tail -25 || status=1
fi
exit $status
