#include "batched_outer.hpp"

#include "argument_checks.hpp"

namespace wmmae_ops {
namespace {

bool is_supported_input(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

}  // namespace

BatchedOuterArgs check_batched_outer(const at::Tensor& u, const std::optional<at::Tensor>& v,
                                     std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(u.dim() >= 1, "batched_outer: argument 'u' must have shape (..., n), got a 0-d tensor");
  TORCH_CHECK(is_supported_input(u.scalar_type()),
              "batched_outer: argument 'u' must be float16, bfloat16 or float32, got ", dtype_name(u.scalar_type()));
  check_dense("batched_outer", "u", u);
  BatchedOuterArgs args{v.has_value() ? *v : u, out_dtype.value_or(at::kFloat)};
  if (v.has_value()) {
    check_dense("batched_outer", "v", *v);
    TORCH_CHECK(v->device() == u.device(), "batched_outer: arguments 'u' and 'v' must be on the same device, got u on ",
                u.device(), " and v on ", v->device());
    TORCH_CHECK(v->scalar_type() == u.scalar_type(), "batched_outer: argument 'v' must have the dtype of 'u' (",
                dtype_name(u.scalar_type()), "), got ", dtype_name(v->scalar_type()));
    TORCH_CHECK(v->sizes() == u.sizes(), "batched_outer: argument 'v' must have the shape of 'u' ", u.sizes(),
                ", got ", v->sizes());
  }
  TORCH_CHECK(is_supported_input(args.out_dtype), "batched_outer: argument 'out_dtype' must be float32, float16 or "
              "bfloat16, got ", dtype_name(args.out_dtype));
  return args;
}

std::vector<std::int64_t> batched_outer_shape(const at::Tensor& u) {
  std::vector<std::int64_t> shape(u.sizes().begin(), u.sizes().end());
  shape.push_back(u.size(-1));
  return shape;
}

}  // namespace wmmae_ops
