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
  so=$(ls torch_wmmae/_C*.so)
  { echo "HMMA / HGMMA (wgmma) instructions per kernel and local-memory use:";
    cuobjdump -sass "$so" | awk '/Function :/{f=$3} /HMMA|HGMMA/{h[f]++} /LDL|STL/{l[f]++} END{for (k in h) print h[k], "HMMA/HGMMA", l[k]+0, "LDL/STL", k}'; } > "$OUT/sass.txt" 2>&1
  cut -c1-160 "$OUT/sass.txt" | head -20
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
