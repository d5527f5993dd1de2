#include "fragment_map.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>


namespace wmmae_ops {
namespace {

using wmmae::Elem;
using wmmae::Order;
using wmmae::Use;

at::Tensor table_from(int num_elements, const std::function<wmmae::RowCol(int, int)>& at_fn) {
  at::Tensor out = at::empty({32, num_elements, 2}, at::TensorOptions().dtype(at::kInt));
  auto acc = out.accessor<int, 3>();
  for (int lane = 0; lane < 32; ++lane) {
    for (int x = 0; x < num_elements; ++x) {
      const wmmae::RowCol rc = at_fn(lane, x);
      acc[lane][x][0] = rc.row;
      acc[lane][x][1] = rc.col;
    }
  }
  return out;
}

at::Tensor analytic_table(const FragmentSpec& spec, std::int64_t arch) {
  if (arch == 70 || arch == 75) {
    require_sm80_layout(spec);  // a fragment that <mma.h> has on no GPU is named as such, not as a missing table
    TORCH_CHECK(wmmae::sm7x_has_table(spec.use, spec.m, spec.n, spec.k, spec.elem), "fragment_map: no analytic sm_",
                arch, " table for ", spec.describe(), " (only m16n16k16 half operands with float or half "
                "accumulators), and device= measures only GPUs of compute capability 8.0 or newer");
  }
  if (arch == 70) {
    return table_from(wmmae::sm70_num_elements(spec.use, spec.elem), [&](int lane, int x) {
      return wmmae::sm70_at(spec.use, spec.order, spec.elem, lane, x);
    });
  }
  const wmmae::CoreLayout layout =
      arch == 75 ? wmmae::sm75_layout(spec.use, spec.m, spec.n, spec.k, spec.elem) : require_sm80_layout(spec);
  return table_from(layout.num_elements, [&](int lane, int x) { return layout.at(lane, x); });
}

// fragment_map has no tensor argument: like a factory function, this kernel picks the backend from
// `device` (CPU when absent, the analytic tables) and re-dispatches.
at::Tensor fragment_map_backend_select(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k,
                                       c10::string_view dtype, std::optional<c10::string_view> layout,
                                       std::optional<std::int64_t> arch, std::optional<at::Device> device) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("wmmae::fragment_map", "")
                             .typed<decltype(fragment_map_cpu)>();
  const c10::DeviceType type = device.has_value() ? device->type() : c10::DeviceType::CPU;
  TORCH_CHECK(type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA,
              "fragment_map: argument 'device' must be a CPU or CUDA device, got ", *device);
  const c10::DispatchKey key = type == c10::DeviceType::CUDA ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  TORCH_CHECK(key != c10::DispatchKey::CUDA || op.hasKernelForDispatchKey(key),
              "fragment_map: this build of torch_wmmae has no CUDA kernels (it was built without nvcc or without a "
              "CUDA-enabled torch)");
  return op.redispatch(c10::DispatchKeySet(key), use, m, n, k, dtype, layout, arch, device);
}

}  // namespace


at::Tensor fragment_map_cpu(c10::string_view use, std::int64_t m, std::int64_t n, std::int64_t k,
                            c10::string_view dtype, std::optional<c10::string_view> layout,
                            std::optional<std::int64_t> arch, std::optional<at::Device> device) {
  const FragmentSpec spec = parse_fragment_spec(use, m, n, k, dtype, layout);
  (void)device;
  TORCH_CHECK(arch.has_value(), "fragment_map: on the CPU pass arch= (70, 75, 80, 86, 89 or 90) for the analytic "
              "table, instead of device=; device= takes a CUDA device, whose layout is measured");
  TORCH_CHECK(*arch == 70 || *arch == 75 || *arch == 80 || *arch == 86 || *arch == 89 || *arch == 90,
              "fragment_map: argument 'arch' must be one of 70, 75, 80, 86, 89, 90, got ", *arch);
  return analytic_table(spec, *arch);
}

TORCH_LIBRARY_IMPL(wmmae, BackendSelect, m) { m.impl("fragment_map", &fragment_map_backend_select); }

}  // namespace wmmae_ops
