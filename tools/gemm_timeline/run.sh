#!/usr/bin/env bash
# Makes a timeline build (stamp_sources.py) in a scratch copy of the tree, once, and runs timeline.py there with
# the arguments given. The tree itself and its own build are left as they were, so tests run after this still
# run the real kernels. On the GPU machine:
#   bash tools/gemm_timeline/run.sh --method auto --shape 512 128 128 64 --json $OUT/auto.json
#   WMMAE_TIMELINE_SKIP_EXIT=1 bash tools/gemm_timeline/run.sh --method auto --shape 512 128 128 64
# TIMELINE_TREE (default /tmp/torch_wmmae_timeline) is the copy.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
copy=${TIMELINE_TREE:-/tmp/torch_wmmae_timeline}
# The build is made again whenever the sources or these tools changed since it was made.
sources=$(cd "$root" && find csrc tools/gemm_timeline setup.py -type f -not -name '*.pyc' | sort | xargs sha1sum | sha1sum)
if [ "$(cat "$copy/.timeline_build_of" 2>/dev/null)" != "$sources" ]; then
  rm -rf "$copy"
  mkdir -p "$copy/benchmarks"
  tar -C "$root" --exclude='*.so' --exclude='__pycache__' -cf - setup.py pyproject.toml README.md csrc torch_wmmae tools \
    | tar -C "$copy" -xf -
  cp "$root/benchmarks/common.py" "$copy/benchmarks/"
  python3 "$copy/tools/gemm_timeline/stamp_sources.py" "$copy" --edit-sources-in-place
  start=$(date +%s)
  (cd "$copy" && TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    python3 setup.py build_ext --inplace > "$copy/build.log" 2>&1) || { tail -40 "$copy/build.log"; exit 1; }
  echo "timeline build: $(( $(date +%s) - start )) s"
  echo "$sources" > "$copy/.timeline_build_of"
fi
cd "$copy"
PYTHONPATH="$copy" python3 tools/gemm_timeline/timeline.py "$@"
