// C++ API test (ctest): the wmmae operators called from LibTorch without Python, on the CPU and, when the
// library has CUDA kernels and a GPU is present, on CUDA tensors. Prints "N passed, N failed" last.
//   test_cpp_api [--dump OUT A B M K N [DEVICE]]   corrected_matmul of the raw float32 M x K and K x N matrices in
//                                                  files A and B (row-major), on the CPU or DEVICE (e.g. cuda), written
//                                                  raw to OUT: tests/test_cpp_api.py compares it with Python's.
//                                                  This mode runs none of the checks above.
#include <torch/torch.h>
#include <torch_wmmae/ops.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  (ok ? passed : failed) += 1;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  return ((out.to(at::kDouble) - ref).norm() / ref.norm()).item<double>();
}

std::string sci(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", v);
  return text;
}

// A rows x cols float32 matrix stored raw (row-major) at path.
at::Tensor read_matrix(const std::string& path, std::int64_t rows, std::int64_t cols) {
  at::Tensor m = at::empty({rows, cols}, at::kFloat);
  std::ifstream in(path, std::ios::binary);
  in.read(static_cast<char*>(m.data_ptr()), static_cast<std::streamsize>(m.nbytes()));
  if (!in || in.gcount() != static_cast<std::streamsize>(m.nbytes()) || in.peek() != std::char_traits<char>::eof()) {
    throw std::runtime_error(path + ": expected exactly " + std::to_string(m.nbytes()) + " bytes");
  }
  return m;
}

bool has_cuda_kernels() {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("wmmae::corrected_matmul", "");
  return op.hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

void check_device(const at::Device& device) {
  const std::string on = " on " + device.str();
  torch::manual_seed(0);
  const at::Tensor a = torch::randn({67, 301}).to(device), b = torch::randn({301, 45}).to(device);
  const at::Tensor ref = at::matmul(a.cpu().to(at::kDouble), b.cpu().to(at::kDouble));
  const double fp32 = rel_err(at::matmul(a.cpu(), b.cpu()), ref);
  for (const char* method : {"auto", "fp16", "tf32"}) {
    const at::Tensor c = torch_wmmae::corrected_matmul(a, b, method);
    const double err = rel_err(c.cpu(), ref);
    check(c.device() == device && c.sizes() == at::IntArrayRef({67, 45}) && err <= 4 * std::max(fp32, 0x1p-24),
          std::string("corrected_matmul ") + method + on + ": rel err " + sci(err));
  }
  {
    // Gradients without Python: corrected_matmul's autograd is registered in C++.
    const at::Tensor ga = a.detach().clone().requires_grad_(), gb = b.detach().clone().requires_grad_();
    const at::Tensor grad = torch::randn({67, 45}).to(device);
    torch_wmmae::corrected_matmul(ga, gb).backward(grad);
    const at::Tensor grad64 = grad.cpu().to(at::kDouble);
    const double err_a = rel_err(ga.grad().cpu(), grad64.matmul(b.cpu().to(at::kDouble).t()));
    const double err_b = rel_err(gb.grad().cpu(), a.cpu().to(at::kDouble).t().matmul(grad64));
    check(ga.grad().sizes() == a.sizes() && gb.grad().sizes() == b.sizes() && err_a < 1e-5 && err_b < 1e-5,
          "corrected_matmul backward" + on + ": rel err " + sci(err_a) + ", " + sci(err_b));
  }
  {
    // Under autocast (the op's autocast kernel is C++ too) a bfloat16 operand is cast to float32: the float32
    // call's result. (Deterministic: no split of K, whose atomics would sum in any order.)
    const at::Tensor a16 = a.to(at::kBFloat16);
    at::globalContext().setDeterministicAlgorithms(true, false);
    at::autocast::set_autocast_enabled(device.type(), true);
    at::autocast::set_autocast_dtype(device.type(), at::kBFloat16);
    const at::Tensor c = torch_wmmae::corrected_matmul(a16, b, "auto");
    at::autocast::set_autocast_enabled(device.type(), false);
    at::autocast::clear_cache();
    const at::Tensor want = torch_wmmae::corrected_matmul(a16.to(at::kFloat), b, "auto");
    at::globalContext().setDeterministicAlgorithms(false, false);
    check(c.scalar_type() == at::kFloat && at::equal(c, want), "corrected_matmul under autocast: bfloat16 cast to float32" + on);
  }
  const at::Tensor u = torch::randn({9, 31}).to(at::kHalf).to(device);
  const at::Tensor p = torch_wmmae::batched_outer(u, std::nullopt, 0.0);
  const at::Tensor u64 = u.cpu().to(at::kDouble);
  check(at::equal(p.cpu(), (u64.unsqueeze(-1) * u64.unsqueeze(-2)).to(at::kFloat)),
        "batched_outer fp16 exact" + on);
  {
    // batched_outer's autograd is registered in C++ as well: v = None, so grad_u = (g + g^T) u.
    const at::Tensor gu = torch::randn({5, 12}).to(device).requires_grad_();
    const at::Tensor g = torch::randn({5, 12, 12}).to(device);
    torch_wmmae::batched_outer(gu, std::nullopt, 0.5).backward(g);
    const at::Tensor g64 = g.cpu().to(at::kDouble);
    const at::Tensor want = (g64 + g64.transpose(-1, -2)).matmul(gu.detach().cpu().to(at::kDouble).unsqueeze(-1)).squeeze(-1);
    const double err = rel_err(gu.grad().cpu(), want);
    check(gu.grad().sizes() == gu.sizes() && err < 1e-5, "batched_outer backward" + on + ": rel err " + sci(err));
  }
  bool threw = false;
  try {
    torch_wmmae::corrected_matmul(a.to(at::kDouble), b);
  } catch (const c10::Error& e) {
    threw = std::string(e.what()).find("argument 'a' must be float32") != std::string::npos;
  }
  check(threw, "corrected_matmul rejects float64 with a clear error" + on);
  if (device.is_cuda()) {
    const at::Tensor measured = torch_wmmae::fragment_map("matrix_a", 16, 16, 16, "half", "row_major", std::nullopt, device);
    const at::Tensor table = torch_wmmae::fragment_map("matrix_a", 16, 16, 16, "half", "row_major", 90);
    check(at::equal(measured.cpu(), table), "fragment_map measured == arch=90 table" + on);
  }
}

// --dump mode: only the product, so that a same-bits test does not repeat the checks that ctest runs.
int dump_product(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: test_cpp_api --dump OUT A B M K N [DEVICE]\n");
    return 2;
  }
  const std::int64_t m = std::stoll(argv[5]), k = std::stoll(argv[6]), n = std::stoll(argv[7]);
  const at::Device device = argc >= 9 ? at::Device(argv[8]) : at::Device(at::kCPU);
  const at::Tensor a = read_matrix(argv[3], m, k).to(device), b = read_matrix(argv[4], k, n).to(device);
  const at::Tensor c = torch_wmmae::corrected_matmul(a, b, "auto").cpu();
  std::ofstream out(argv[2], std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), c.nbytes());
  return out ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--dump") return dump_product(argc, argv);

  // The paper's Table 2 (sm_70, matrix_a col_major): lane 0 holds column-major indices 0..3, 64..67, ...
  const at::Tensor t = torch_wmmae::fragment_map("matrix_a", 16, 16, 16, "half", "col_major", 70);
  const at::Tensor lane0 = t[0].select(1, 0) + 16 * t[0].select(1, 1);
  const std::vector<int> expected = {0, 1, 2, 3, 64, 65, 66, 67, 128, 129, 130, 131, 192, 193, 194, 195};
  check(at::equal(lane0, at::tensor(expected, at::kInt)), "fragment_map arch=70 lane 0 = paper's Table 2");

  check_device(at::Device(at::kCPU));
  if (has_cuda_kernels() && torch::cuda::is_available()) check_device(at::Device(at::kCUDA, 0));
  else std::printf("skip CUDA checks (no CUDA kernels in this build, or no GPU)\n");

  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
