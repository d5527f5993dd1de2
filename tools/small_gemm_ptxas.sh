#!/usr/bin/env bash
# Compiles only the small GEMM's kernels (csrc/ops/corrected_gemm_small.cuh) for sm_90a and prints ptxas's
# registers and spill bytes per kernel: about 45 s on 2 cores instead of a whole build, no GPU.
#   bash tools/small_gemm_ptxas.sh                  # every instantiation the host launches
#   bash tools/small_gemm_ptxas.sh "<64, 64, true, true, true>" ...   # the named ones (template arguments)
#   SMALL_GEMM_CUBIN=/tmp/small.cubin bash tools/small_gemm_ptxas.sh    # also keep the cubin, e.g. for
#       python tools/sass_report.py /tmp/small.cubin   (local memory in the products' loops, without a build)
# Needs torch (its headers) and nvcc ($CUDA_HOME or /usr/local/cuda). The translation unit, in a temporary folder
# (not in csrc, where a build would pick it up), is the header corrected_gemm_small.cuh plus explicit
# instantiations; nvcc's flags are the build's that matter to ptxas (torch builds extensions with
# --expt-relaxed-constexpr).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src="$tmp/small_gemm.cu"
echo '#include "corrected_gemm_small.cuh"' > "$src"
{
  echo "namespace wmmae_ops {"
  if [ $# -gt 0 ]; then
    for x in "$@"; do echo "template __global__ void corrected_gemm_small_kernel$x(GemmArgs);"; done
  else
    # The kernels launch_small_gemm_tile picks from, as the header defines them: each tile's K buckets
    # (small_gemm_k_bucket), and both products where the bucket has two (SmallKBucket::kHasHhPerFragment). Taking a
    # kernel's address instantiates it.
    cat <<'EOF'
template <int kTile, int kMaxK, bool kARowMajor, bool kBRowMajor>
void instantiate_small_gemm_kernels() {
  if constexpr (small_gemm_k_bucket(kTile, kMaxK) == kMaxK) {
    (void)&corrected_gemm_small_kernel<kTile, kMaxK, kARowMajor, kBRowMajor, false>;
    if constexpr (SmallKBucket<kTile, kMaxK>::kHasHhPerFragment) {
      (void)&corrected_gemm_small_kernel<kTile, kMaxK, kARowMajor, kBRowMajor, true>;
    }
  }
}
EOF
    for t in 16 32 64; do for k in 32 64 128; do for a in true false; do for b in true false; do
      echo "template void instantiate_small_gemm_kernels<$t, $k, $a, $b>();"
    done; done; done; done
  fi
  echo "}"
} >> "$src"
includes=$(python3 -c "import sysconfig, torch.utils.cpp_extension as c
paths = c.include_paths(device_type='cuda') + [sysconfig.get_paths()['include']]
print(' '.join('-I' + p for p in paths))" 2>/dev/null)
# shellcheck disable=SC2086
"$nvcc" -O3 -std=c++17 -DWMMAE_WITH_CUDA -DWMMAE_HAS_SM90A -gencode arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -Icsrc -Icsrc/ops $includes -cubin -o "${SMALL_GEMM_CUBIN:-/dev/null}" "$src" -Xptxas -v 2>&1 | python3 -c '
import re, subprocess, sys
name, spill, log, found = None, "", [], 0
for line in sys.stdin:
    log.append(line)
    m = re.search(r"Compiling entry function .(\S+). for", line)
    if m:
        name = m.group(1)
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        spill = m.group(0)
    m = re.search(r"Used (\d+) registers", line)
    if m and name and "corrected_gemm_small_kernel" in name:
        text = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
        text = re.sub(r"\(.*\)$", "", text).replace("wmmae_ops::", "").replace("(anonymous namespace)::", "")
        print(f"{text}: {m.group(1)} registers, {spill}")
        name, found = None, found + 1
if not found:  # (a compile error: show what nvcc said)
    sys.stderr.writelines(log)
    sys.exit(1)
' | sort -t'<' -k2 -V
