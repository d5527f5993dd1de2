#!/usr/bin/env bash
# Session 108, one call (one H200). build/sx108d = the working tree (column-major B by residue: the split's column
# groups without bank conflicts; the small GEMM's odd-width bound at 2^18 outputs), build/sx108m = main. Session 107's
# run of the same code lost a worker to a segmentation fault in a small-GEMM case (k46_partial_chunks-wide-auto: 3 x 30
# x 62, which neither change touches); PYTHONFAULTHANDLER writes the crashing thread's Python stack into the log. Tests
# on d, memcheck over column-major B by residue, then per build ncu on one 2048^2 x 2047 x @ W.t() launch and
# bench_unaligned.py.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
use() { rm -f torch_wmmae/_C*.so; cp build/$1/_C.so torch_wmmae/_C$suffix; }
use sx108d
start=$(date +%s)
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 14 -rf tests/test_kernel_paths.py tests/test_corrected_matmul.py \
  tests/test_bad_inputs.py > $OUT/t_d.log 2>&1
grep -E "^(FAILED|ERROR)|node down|crashed|Fatal|Segmentation" $OUT/t_d.log | head -30
echo "d paths+matmul+bad: $(tail -1 $OUT/t_d.log | cut -c1-160) ($(( $(date +%s) - start )) s)"
start=$(date +%s)
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -p no:cacheprovider \
  tests/test_kernel_paths.py -k "b_by_residue and not batched and not b_row" > $OUT/san_memcheck.log 2>&1
echo "d memcheck rc=$? $(grep -E "ERROR SUMMARY|passed|failed" $OUT/san_memcheck.log | tail -2 | tr '\n' ' ') ($(( $(date +%s) - start )) s)"
cat > /tmp/one_call.py <<'PY'
import torch, torch_wmmae
x = torch.rand(2048, 2047, device="cuda") * 2 - 1
w = torch.rand(2048, 2047, device="cuda") * 2 - 1
for _ in range(3):
    torch_wmmae.corrected_matmul(x, w.t())
torch.cuda.synchronize()
PY
for build in sx108m sx108d; do
  use $build
  timeout 40 ncu --kernel-name regex:corrected_gemm_sm90_kernel --launch-skip 2 --launch-count 1 \
    --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed.sum,gpu__time_duration.sum \
    python3 /tmp/one_call.py 2>&1 | grep -E "sum|rror" | sed "s/^/$build /"
  mkdir -p $OUT/$build
  start=$(date +%s)
  timeout 75 python3 benchmarks/bench_unaligned.py --out $OUT/$build > $OUT/bench_$build.log 2>&1
  echo "$build bench rc=$? ($(( $(date +%s) - start )) s)"
done
