// The wmmae operator library: every schema, next to its CPU implementation. The CUDA implementations
// register themselves in ops/*_cuda.cu (TORCH_LIBRARY_IMPL(wmmae, CUDA, ...)).
#include <torch/library.h>

#include "ops/batched_outer.hpp"
#include "ops/corrected_matmul_scheme.hpp"
#include "ops/fragment_map.hpp"
#include "ops/matmul_plan.hpp"

namespace wmmae_ops {

at::Tensor corrected_matmul_cpu(const at::Tensor& a, const at::Tensor& b, c10::string_view method);
at::Tensor batched_outer_cpu(const at::Tensor& u, const std::optional<at::Tensor>& v, double alpha,
                             std::optional<at::ScalarType> out_dtype);

Method method_from_string(const std::string& name) {
  if (name == "fp16") return Method::fp16;
  if (name == "tf32") return Method::tf32;
  if (name == "auto") return Method::automatic;
  TORCH_CHECK(false, "corrected_matmul: argument 'method' must be 'auto', 'fp16' or 'tf32', got '", name, "'");
}

namespace {

// Sparse, quantized, MKL-DNN and nested tensors would otherwise meet the dispatcher's "Could not run ... with
// arguments from the 'SparseCPU' backend", which names no argument. Registered for those dispatch keys, these
// kernels run the ops' own argument checks, whose dtype, layout or nested-tensor check names the argument.
at::Tensor corrected_matmul_not_dense(const at::Tensor& a, const at::Tensor& b, c10::string_view) {
  plan_matmul(a, b, "corrected_matmul");
  TORCH_CHECK(false, "corrected_matmul: arguments that passed its checks reached a kernel for other tensor kinds");
}

at::Tensor batched_outer_not_dense(const at::Tensor& u, const std::optional<at::Tensor>& v, double,
                                   std::optional<at::ScalarType> out_dtype) {
  check_batched_outer(u, v, out_dtype);
  TORCH_CHECK(false, "batched_outer: arguments that passed its checks reached a kernel for other tensor kinds");
}

}  // namespace

TORCH_LIBRARY(wmmae, m) {
  m.def("corrected_matmul(Tensor a, Tensor b, str method=\"auto\") -> Tensor");
  m.impl("corrected_matmul", c10::DispatchKey::CPU, TORCH_FN(corrected_matmul_cpu));

  m.def("batched_outer(Tensor u, Tensor? v=None, float alpha=0.0, ScalarType? out_dtype=None) -> Tensor");
  m.impl("batched_outer", c10::DispatchKey::CPU, TORCH_FN(batched_outer_cpu));

  // No tensor argument: a BackendSelect kernel (ops/fragment_map.cpp) routes by `device`.
  m.def("fragment_map(str use, int m, int n, int k, str dtype, str? layout=None, int? arch=None, "
        "Device? device=None) -> Tensor");
  m.impl("fragment_map", c10::DispatchKey::CPU, TORCH_FN(fragment_map_cpu));

  // The CUDA GEMM's launch grid for a problem on a GPU of `sm_count` SMs and `l2_bytes` of L2 (long_k_splits
  // reads it; 0 by default, as if no operand fitted), [tiles per batch entry, K splits, blocks of that grid,
  // stream-K blocks of the wgmma kernel (0: it runs the grid too), blocks of the wgmma kernel with TMA stages
  // when it takes the batch entries in one round (0: the grid)]: the benchmarks record it.
  m.def("_corrected_matmul_grid(int m, int n, int k, int batch, int sm_count, int l2_bytes=0) -> int[]",
        [](std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, std::int64_t sm_count,
           std::int64_t l2_bytes) {
          const GemmGrid grid = plan_gemm_grid(m, n, k, batch, sm_count, l2_bytes);
          return std::vector<std::int64_t>{grid.tiles, grid.k_splits, grid.blocks(), grid.stream_k_blocks,
                                           grid.tiles * grid.persistent_batch_slots};
        });

  // How many tile rows the GEMM's consecutive tiles walk down (gemm_tile_group_rows) for K `k` cut into
  // `k_splits` (_corrected_matmul_grid's second entry) on a GPU with `l2_bytes` of L2: the benchmarks record it.
  m.def("_tile_group_rows(int k, int l2_bytes, int k_splits=1) -> int",
        [](std::int64_t k, std::int64_t l2_bytes, std::int64_t k_splits) -> std::int64_t {
          return gemm_tile_group_rows(k, l2_bytes, k_splits);
        });

  // Where each block's stream-K share starts, as the CUDA op schedules `tiles` tiles (batch entries included) of
  // `k_stages` k-stages over `blocks` blocks: blocks + 1 units, the last the end of the work. Tests check the
  // schedule on the CPU.
  m.def("_stream_k_shares(int tiles, int k_stages, int blocks) -> int[]", &stream_k_shares);

  // The GEMM kernels that corrected_matmul chooses on `like`'s device, as the host decides them on each call
  // (the environment switches included): "sm90" (the wgmma kernels), "sm90_tma" (their fp32 stages may come by
  // TMA), "overlap_launches" (programmatic dependent launch). Empty on the CPU. Tests read it to know which
  // paths run without asking torch.profiler, which records no kernels under compute-sanitizer.
  m.def("_corrected_matmul_kernel_choice(Tensor like) -> str[]");
  m.impl("_corrected_matmul_kernel_choice", c10::DispatchKey::CPU,
         [](const at::Tensor&) { return std::vector<std::string>{}; });

  for (const auto key : {c10::DispatchKey::SparseCPU, c10::DispatchKey::SparseCUDA, c10::DispatchKey::SparseCsrCPU,
                         c10::DispatchKey::SparseCsrCUDA, c10::DispatchKey::QuantizedCPU, c10::DispatchKey::QuantizedCUDA,
                         c10::DispatchKey::MkldnnCPU, c10::DispatchKey::NestedTensorCPU,
                         c10::DispatchKey::NestedTensorCUDA}) {
    m.impl("corrected_matmul", key, TORCH_FN(corrected_matmul_not_dense));
    m.impl("batched_outer", key, TORCH_FN(batched_outer_not_dense));
  }
}

}  // namespace wmmae_ops

