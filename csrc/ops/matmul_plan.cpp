#include "matmul_plan.hpp"

#include "argument_checks.hpp"
#include "corrected_matmul_scheme.hpp"
#include "kernel_switches.hpp"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>

#include <algorithm>
#include <cmath>

namespace wmmae_ops {

namespace {

// The batch dimensions of a and b (expanded to batch_shape) as at most kMaxBatchDims (size, stride) triples:
// size-1 dimensions dropped, dimensions that are contiguous in both operands merged, innermost last. False
// where more remain.
bool coalesce_batch(const at::Tensor& a, const at::Tensor& b, at::IntArrayRef batch_shape, BatchStrides& bs) {
  bs = BatchStrides{};
  for (std::size_t d = 0; d < batch_shape.size(); ++d) {
    const std::int64_t size = batch_shape[d];
    if (size == 1) continue;
    const std::int64_t sa = a.stride(d), sb = b.stride(d);
    if (bs.ndim > 0 && bs.a_stride[bs.ndim - 1] == sa * size && bs.b_stride[bs.ndim - 1] == sb * size) {
      bs.size[bs.ndim - 1] *= size;
      bs.a_stride[bs.ndim - 1] = sa;
      bs.b_stride[bs.ndim - 1] = sb;
      continue;
    }
    if (bs.ndim == kMaxBatchDims) return false;
    bs.size[bs.ndim] = size;
    bs.a_stride[bs.ndim] = sa;
    bs.b_stride[bs.ndim] = sb;
    ++bs.ndim;
  }
  return true;
}

}  // namespace

MatmulPlan plan_matmul(const at::Tensor& a, const at::Tensor& b, const char* op_name) {
  TORCH_CHECK(a.dim() >= 1, op_name, ": argument 'a' must have at least 1 dimension, got a 0-d tensor");
  TORCH_CHECK(b.dim() >= 1, op_name, ": argument 'b' must have at least 1 dimension, got a 0-d tensor");
  TORCH_CHECK(a.scalar_type() == at::kFloat, op_name, ": argument 'a' must be float32, got ", dtype_name(a.scalar_type()));
  TORCH_CHECK(b.scalar_type() == at::kFloat, op_name, ": argument 'b' must be float32, got ", dtype_name(b.scalar_type()));
  check_dense(op_name, "a", a);
  check_dense(op_name, "b", b);
  TORCH_CHECK(a.device() == b.device(), op_name, ": arguments 'a' and 'b' must be on the same device, got a on ",
              a.device(), " and b on ", b.device());

  // A 1-D operand is a row (a) or a column (b) vector whose dimension disappears from the result.
  const at::Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const at::Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const std::int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  TORCH_CHECK(b2.size(-2) == k, op_name, ": inner dimensions do not match: 'a' has shape ", a.sizes(),
              " and 'b' has shape ", b.sizes(), " (a.size(-1) must equal b.size(", b.dim() == 1 ? -1 : -2, "))");

  const auto a_batch = a2.sizes().slice(0, a2.dim() - 2);
  const auto b_batch = b2.sizes().slice(0, b2.dim() - 2);
  // (at::infer_size's own message names neither the op nor its arguments)
  const std::size_t batch_dims = std::max(a_batch.size(), b_batch.size());
  std::vector<std::int64_t> batch_shape(batch_dims);
  for (std::size_t i = 1; i <= batch_dims; ++i) {  // from the right, as broadcasting aligns them
    const std::int64_t from_a = i <= a_batch.size() ? a_batch[a_batch.size() - i] : 1;
    const std::int64_t from_b = i <= b_batch.size() ? b_batch[b_batch.size() - i] : 1;
    TORCH_CHECK(from_a == from_b || from_a == 1 || from_b == 1, op_name, ": the batch dimensions of 'a' ", a_batch,
                " and 'b' ", b_batch, " do not broadcast ('a' has shape ", a.sizes(), ", 'b' ", b.sizes(), ")");
    batch_shape[batch_dims - i] = from_a == 1 ? from_b : from_a;
  }

  std::vector<std::int64_t> a_shape(batch_shape), b_shape(batch_shape);
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});

  // (expand only where it changes the shape: each view is a dispatcher call, and the host's time per call
  // decides the speed of small products)
  MatmulPlan plan;
  plan.a = a2.sizes().equals(a_shape) ? a2 : a2.expand(a_shape);
  plan.b = b2.sizes().equals(b_shape) ? b2 : b2.expand(b_shape);
  plan.m = m;
  plan.n = n;
  plan.k = k;

  plan.out_shape = batch_shape;
  if (a.dim() > 1) plan.out_shape.push_back(m);
  if (b.dim() > 1) plan.out_shape.push_back(n);

  // More strided batch dimensions than the kernels take (torch.matmul takes any): copies of the operands whose
  // batch dimensions coalesce, one operand's own first (a broadcast operand stays unexpanded), then both
  // expanded (always one dimension).
  // Each copy is made only when the candidates before it failed.
  if (!coalesce_batch(plan.a, plan.b, batch_shape, plan.batch_strides)) {
    const auto take = [&](const at::Tensor& ca, const at::Tensor& cb) {
      const at::Tensor ea = ca.expand(a_shape), eb = cb.expand(b_shape);
      if (!coalesce_batch(ea, eb, batch_shape, plan.batch_strides)) return false;
      plan.a = ea;
      plan.b = eb;
      return true;
    };
    const at::Tensor a_own = a2.contiguous();
    if (!take(a_own, b2)) {
      const at::Tensor b_own = b2.contiguous();
      if (!take(a2, b_own) && !take(a_own, b_own)) {
        const bool merged = take(plan.a.contiguous(), plan.b.contiguous());
        TORCH_INTERNAL_ASSERT(merged, "contiguous operands' batch dimensions merge into one");
      }
    }
  }
  plan.batch = c10::multiply_integers(batch_shape);
  return plan;
}

// Folded, the tiles run on across the entries' boundaries (no partial tile per entry), B's column ranges are found
// once, an A whose batch stride is not a multiple of 16 bytes is one matrix that the GEMM reads by residue of its
// rows, and the 2-D rules (split-K, stream-K, tile groups) plan the whole product. H200, session 113, us per
// call back to back, auto, folded / batch kept (torch fp32), x @ W.t(): 16 x 1 x 4096 x 4096 62.1 / 719 (50.7), 256 x 7
// x 1024 x 1024 (W row-major) 44.5 / 762 (99.4), 32 x 128 x 4096 x 4096 943 / 1671 (2745), 8 x 1025 x 1024 x 1023 185 /
// 217 (350), 64 x 100 x 1000 x 1000 136 / 179 (329), 1000 x 16 x 16 x 64 9.9 / 13.8 (5.6). Entries of whole 128-row
// tiles gain none of the first two, and where the batched plan takes persistent batch slots (persistent_batch_slots,
// which a 2-D grid does not have; the fp16 wgmma GEMM with TMA stages runs them) the batch was the faster: 64 x 512^3
// (W row-major) 184 / 162, 8 x 1024^3 150 / 146; those keep their batch (for every method and GPU: the other
// kernels' batched grids were not measured against the fold).
bool fold_batch_into_rows(MatmulPlan& plan, std::int64_t sm_count, std::int64_t l2_bytes) {
  if (env_switch("TORCH_WMMAE_FOLD_BATCH") == Switch::kOff) return false;
  const BatchStrides& bs = plan.batch_strides;
  // (a broadcast too, a batch stride of 0, would fold into rows 0 apart, which TMA cannot read: copied)
  if (plan.batch < 2 || bs.ndim != 1 || bs.b_stride[0] != 0 || bs.a_stride[0] == 0) return false;
  const at::Tensor& a = plan.a;
  const std::int64_t row_stride = plan.m == 1 ? bs.a_stride[0] : a.stride(-2);
  if (bs.a_stride[0] != plan.m * row_stride) return false;
  if (sm_count > 0 && plan.m % kGemmTile == 0 &&
      plan_gemm_grid(plan.m, plan.n, plan.k, plan.batch, sm_count, l2_bytes).persistent_batch_slots > 0) {
    return false;
  }
  plan.a = a.as_strided({plan.batch * plan.m, plan.k}, {row_stride, a.stride(-1)}, a.storage_offset());
  plan.b = plan.b.as_strided({plan.k, plan.n}, {plan.b.stride(-2), plan.b.stride(-1)}, plan.b.storage_offset());
  plan.m *= plan.batch;
  plan.batch = 1;
  plan.batch_strides = BatchStrides{};
  return true;
}

namespace {

// K elements per split when K is cut into `splits` parts: whole 32-wide k-stages.
std::int64_t k_per_split(std::int64_t k, int splits) { return ((k + splits - 1) / splits + 31) / 32 * 32; }

// At most `splits` splits, none of them empty: pieces of whole k-stages can cover K before the last one
// (K = 2048 in 9: pieces of 256, and 8 of them cover K), whose blocks would only flush zeros. No more splits
// than k-stages to start from, as each non-empty one takes at least one.
int nonempty_splits(std::int64_t k, int splits) {
  splits = static_cast<int>(std::min<std::int64_t>(splits, std::max<std::int64_t>(1, gemm_k_stages(k))));
  while (splits > 1 && (splits - 1) * k_per_split(k, splits) >= k) --splits;
  return splits;
}

// The number of splits that minimizes waves x (k per split + kBlockOverheadK): the busy fraction of the
// last wave of `blocks` blocks, discounted by what a block costs besides its k-stages. That cost is fitted to
// measurements (H200, M = 128, K = 4096, 17 values of N from 1024 to 45120, every split count from 1 to 16;
// benchmarks/NOTES.md), not derived: it stands for the pipeline fill, the chunk flushes and whatever else a
// short block does not amortize. With the 96 k assumed before, a shape whose tiles nearly fill one wave was
// split into several short waves: N = 14400 took 405 us split 7 ways against 301 us unsplit, N = 45120 981
// against 691 us. With 1024, every measured shape runs within 9% of its best split count (mean 1.5%).
// From 4 waves of tiles on, only long K splits (long_k_splits; plan_gemm_grid takes them below that too, where
// long_k_split_below_4_waves says so). (plan_gemm_grid turns split-K off in deterministic mode: the fp32
// atomics that combine the splits make the last bits depend on their order.)
constexpr std::int64_t kBlockOverheadK = 1024;
// A grid of at least this many waves of tiles: no split-K but the long-K rule's, no stream-K.
constexpr std::int64_t kManyTileWaves = 4;
int choose_k_splits(std::int64_t blocks, std::int64_t k, int sms, std::int64_t l2_bytes) {
  if (blocks >= kManyTileWaves * sms) return long_k_splits(k, l2_bytes);
  int best = 1;
  double best_score = 0.0;
  for (int s = 1; s <= 32; ++s) {
    const std::int64_t k_per = k_per_split(k, s);
    if (s > 1 && k_per < 256) break;
    if (nonempty_splits(k, s) < s) continue;  // the same pieces as fewer splits, and blocks that do nothing
    const std::int64_t total = blocks * s;
    const std::int64_t waves = (total + sms - 1) / sms;
    const double score = static_cast<double>(total) / static_cast<double>(waves * sms) *
                         static_cast<double>(k_per) / static_cast<double>(k_per + kBlockOverheadK);
    if (score > best_score * 1.02) {  // more splits only for a clear gain
      best = s;
      best_score = score;
    }
  }
  return best;
}

// Whether a grid of fewer than 4 waves of tiles (`blocks`, batch slots included) takes the long-K split too, and
// no stream-K: large outputs (accumulation chunks of 4096) with K > kLongKSplitAboveK, where the split's blocks
// fill their waves (blocks / (waves x SMs)) to at least kLongKMinWaveFill. There the wave rule (choose_k_splits)
// leaves K whole, or the stream-K rule takes its one block per SM, which under held load were both slower.
// H200, auto, one process, two rounds each, held 2 s / burst TFLOP/s, the earlier choice -> 2 splits
// (benchmarks/NOTES.md, session 67):
// stream-K at 2048 x 4096 x 8192 113.7-114.4 / 130.1-130.4 -> 122.8-122.9 / 134.7-134.8, 2048^2 x 16384 110.1-110.2
// / 128.3-128.7 -> 121.7 / 134.6-134.8, 2048 x 3584 x 4608 111.8-112.1 / 127.8-128.1 -> 117.5-117.8 / 126.3-126.6,
// 2560 x 3072 x 8192 (fill 0.91) 112.4-112.6 / 130.8-130.9 -> 117.7-118.0 / 127.3-127.6; unsplit (chunks read back
// in one batch) at 2048^2 x 8192 119.2-119.6 / 126.3-127.0 -> 119.9-120.0 / 127.9-129.0, 1024 x 4096 x 8192
// 117.6-118.1 / 124.8-125.5 -> 119.3 / 128.0-128.1, 2048^2 x 4608 113.4-113.8 / 116.6-117.3 -> 115.4-115.5 /
// 121.4-121.9 (and three more shapes, 0.5-1% held). Below that fill the stream-K schedule stays: 1536 x 3584 x
// 8192 (fill 0.85) 110.3 / 128.9-129.2 against 2 splits' 108.7-108.8 / 117.4-117.7, 1536 x 3072 x 8192 (0.87,
// 2 splits and stream-K) 112.1-112.2 / 128.9-129.3 against 113.3 / 119.2.
constexpr double kLongKMinWaveFill = 0.9;
bool long_k_split_below_4_waves(std::int64_t blocks, std::int64_t m, std::int64_t n, std::int64_t k, int sms,
                                std::int64_t l2_bytes) {
  if (blocks >= kManyTileWaves * sms || accumulation_chunk(m, n) != kAccumulationChunkLarge || k <= kLongKSplitAboveK) {
    return false;
  }
  const std::int64_t split_blocks = blocks * long_k_splits(k, l2_bytes);
  const std::int64_t waves = (split_blocks + sms - 1) / sms;
  return static_cast<double>(split_blocks) >= kLongKMinWaveFill * static_cast<double>(waves * sms);
}

// TORCH_WMMAE_STREAM_K (see plan_gemm_grid): kChoose when unset, but kNever where TORCH_WMMAE_K_SPLITS has
// set the split count (`splits_forced`), which stream-K would replace.
enum class StreamK { kChoose, kNever, kAlways };
StreamK stream_k_policy(bool splits_forced) {
  switch (env_switch("TORCH_WMMAE_STREAM_K")) {
    case Switch::kOff: return StreamK::kNever;
    case Switch::kOn: return StreamK::kAlways;
    case Switch::kUnset: break;
  }
  return splits_forced ? StreamK::kNever : StreamK::kChoose;
}

// Whether stream_k_share's arithmetic stays within 64 bits: it multiplies a block index by all units of work
// (each tile's k-stages and the gap after it). (Work past 2^62 units would take a GPU years.)
bool stream_k_units_fit(std::int64_t tiles, std::int64_t k_stages, std::int64_t blocks) {
  return static_cast<double>(tiles) * static_cast<double>(k_stages + kStreamKCrossingStages) *
             static_cast<double>(blocks) <= 0x1p62;
}

// What stream-K's slowest block costs, in k-stages: a share's stages plus kStreamKCrossingStages for each tile
// boundary inside it (see stream_k_share).
std::int64_t stream_k_max_cost(std::int64_t tiles, std::int64_t k_stages, std::int64_t blocks, std::int64_t gap) {
  std::int64_t worst = 0;
  for (std::int64_t b = 0, begin = 0; b < blocks; ++b) {
    const std::int64_t end = stream_k_share(b + 1, blocks, tiles, k_stages, gap);
    if (end > begin) {
      const std::int64_t crossings = (end - 1) / k_stages - begin / k_stages;
      worst = std::max(worst, end - begin + kStreamKCrossingStages * crossings);
    }
    begin = end;
  }
  return worst;
}
// stream_k_share's gap: kStreamKCrossingStages where that makes the slowest block cheaper, 0 where equal shares
// of stages are as cheap (e.g. 4 blocks per tile, each within its tile). Remembers the last problem: the loops
// above take about 2 us of host time per call, and a training loop repeats its shapes.
std::int64_t stream_k_gap(std::int64_t tiles, std::int64_t k_stages, std::int64_t blocks) {
  thread_local std::int64_t last[4] = {-1, -1, -1, 0};  // tiles, k_stages, blocks, gap
  if (last[0] != tiles || last[1] != k_stages || last[2] != blocks) {
    const bool gapped = stream_k_max_cost(tiles, k_stages, blocks, kStreamKCrossingStages) <
                        stream_k_max_cost(tiles, k_stages, blocks, 0);
    last[0] = tiles, last[1] = k_stages, last[2] = blocks, last[3] = gapped ? kStreamKCrossingStages : 0;
  }
  return last[3];
}

// Stream-K's blocks: one per SM, each at least kMinStreamKStages stages (as split-K's 256 k). Chosen where
// shares of equal stages would be shorter than the split-K grid's waves run one after the other (waves x stages
// per split) by a margin: kStreamKGain times those, and kStreamKPieceStages fewer (kStreamKShortPieceStages for
// shares under kStreamKShortShare stages). Stream-K balances the waves but costs more per block (it crosses
// into two or three tiles, each a pipeline fill and a flush of atomics into an output that the pre-pass must
// zero first), so it loses where the grid is nearly balanced already. These margins were measured with shares
// of equal stages (before stream_k_share's gap). H200, the same build, GPU time per call, grid -> stream-K:
// 128 x N x 4096, N = 3392 ... 45120 (13 shapes, stream-K 0.73-0.93 of the grid's stages) 6-25% faster;
// 2048^3, 8 x 1024^3, 1000 x 1016 x 3332 (0.96-0.98, 2-3 stages fewer) 2.5-8% slower (session 16). Short
// shares pay the fixed cost most: at M = 128, K = 4096, N = 1024-3840 (8-30 stages per block, 0.80-0.94 of the
// grid's) stream-K was up to 11% slower (session 19), and with 5 stages fewer at 27-59 stages per block 1-4%
// slower (N = 3392, 4928, 7616, session 22); long ones gain even near the grid's stages: 81-248 stages per
// block at 0.94-0.97 of the grid's, 5-8 stages fewer, 1-8% faster (N = 10560, 15936-16128, 24064-24576,
// 32064-32640, session 22), but not at 0.973-0.977 from N = 32768 on, where the grid's blocks sum K in one
// chunk (3% slower; benchmarks/NOTES.md).
//
// A grid block that sums several chunks of K into a small output without split-K reads its tile's partial sums
// back at each chunk's end (sm90_read_back in corrected_gemm_common.cuh), where stream-K's atomics do not wait:
// the rule counts kReadBackStages k-stages for each. H200, the same build, grid -> stream-K, 128 x N x 4096
// (four chunks per block): N = 16192-16896 (127-132 tiles, one wave; at 132 tiles the same stages per block)
// 8-10% faster, N = 32704 (two waves) 9% faster; N = 33792 (chunks of 4096: nothing to read back) 1.5% slower.
// Large outputs' chunks of 4096 are not counted: that would choose stream-K on grids whose waves are nearly full,
// where it was 1.5-8.5% slower under held load than the unsplit grid (H200, session 67: 2048^2 x 8192, 2048 x
// 3072 x 8192, 2048 x 4096 x 6144, 1024 x 4096 x 8192, 4096 x 2048 x 12288), and those grids take the long-K
// split now (long_k_split_below_4_waves).
constexpr std::int64_t kMinStreamKStages = 8;
constexpr double kStreamKGain = 0.97;
constexpr std::int64_t kStreamKPieceStages = 4;
constexpr std::int64_t kStreamKShortShare = 72;
constexpr std::int64_t kStreamKShortPieceStages = 6;
constexpr std::int64_t kReadBackStages = 4;
std::int64_t stream_k_blocks(std::int64_t tiles, std::int64_t m, std::int64_t n, std::int64_t k, int k_splits,
                             int sms, StreamK policy) {
  if (policy == StreamK::kNever || at::globalContext().deterministicAlgorithms()) return 0;
  const std::int64_t k_stages = gemm_k_stages(k);
  if (!stream_k_units_fit(tiles, k_stages, sms)) return 0;  // (the grid runs instead)
  const std::int64_t blocks = std::min<std::int64_t>(sms, tiles * k_stages / kMinStreamKStages);
  if (blocks < 2) return 0;
  if (policy == StreamK::kAlways) return blocks;
  if (tiles >= kManyTileWaves * sms) return 0;
  const std::int64_t split_waves = (tiles * k_splits + sms - 1) / sms;
  std::int64_t split_stages = split_waves * (k_per_split(k, k_splits) / kGemmStageK);
  if (k_splits == 1 && accumulation_chunk(m, n) == kAccumulationChunkSmall) {
    split_stages += split_waves * ((k - 1) / kAccumulationChunkSmall) * kReadBackStages;
  }
  const std::int64_t stream_k_stages = (tiles * k_stages + blocks - 1) / blocks;
  const std::int64_t margin = stream_k_stages < kStreamKShortShare ? kStreamKShortPieceStages : kStreamKPieceStages;
  const bool gains = static_cast<double>(stream_k_stages) < kStreamKGain * static_cast<double>(split_stages) &&
                     stream_k_stages < split_stages - margin;
  return gains ? blocks : 0;
}

// The wgmma fp16 kernel with TMA stages, batched: one round of blocks, each taking batch entries z, z + slots,
// z + 2 slots, ... of its tile (the kernel loops over them, its ring of stages running on from one to the
// next), where that needs no more rounds than the full grid has waves and the tiles are short (K <= 1024). A
// block costs a few microseconds besides its tiles (session 23 measured about 5 of a 21 us tile at 64 x
// 512^3), and blocks that stay spare some of it. H200, GPU time per call, full grid -> persistent, three
// rounds: 64 x 512^3 auto 182.1-184.1 -> 178.0-180.4 us, fp16 179.5-180.7 -> 175.4-176.9, both column-major
// 178.7-179.5 -> 176.8-178.1, 8 x 1024^3 156.9-157.5 -> 154.1-154.9, 64 x 512 x 512 x 256 120.7-120.9 ->
// 118.0-118.3; but 1000 x 128 x 128 x 4096 (128 stages per tile) 2262-2285 -> 2281-2290, and the other
// kernels slower: tf32 64 x 512^3 440-444 -> 448-453, cp.async stages 239-240 -> 243-244 (benchmarks/NOTES.md,
// session 29). The kernel runs one block per SM (its registers), so a round is SMs / tiles batch slots. 0: keep
// `grid` (its tiles, K splits and batch slots are set).
constexpr std::int64_t kPersistentMaxStages = 32;
std::int64_t persistent_batch_slots(const GemmGrid& grid, std::int64_t batch, std::int64_t k, std::int64_t sms) {
  const std::int64_t tiles = grid.tiles;
  if (grid.k_splits != 1 || tiles > sms || gemm_k_stages(k) > kPersistentMaxStages) return 0;
  const std::int64_t slots = std::max<std::int64_t>(1, sms / tiles);
  const std::int64_t rounds = (batch + slots - 1) / slots, waves = (tiles * batch + sms - 1) / sms;
  return slots < grid.batch_slots && rounds <= waves ? slots : 0;
}

}  // namespace

GemmGrid plan_gemm_grid(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, std::int64_t sm_count,
                        std::int64_t l2_bytes) {
  TORCH_CHECK(m >= 1 && n >= 1 && batch >= 1 && k >= 0, "plan_gemm_grid: arguments 'm', 'n' and 'batch' must be "
              "positive and 'k' non-negative (an empty product launches no GEMM), got ", m, ", ", n, ", ", batch,
              " and ", k);
  TORCH_CHECK(sm_count > 0 && sm_count < (1 << 20), "plan_gemm_grid: argument 'sm_count' must be a positive SM "
              "count, got ", sm_count);
  // An output has at least one element per tile and batch entry, so a tensor's would never fail these (2^46
  // floats are 256 TiB); they keep the plan's counts within 64 bits: blocks() = tiles x splits (< 2^16) x batch
  // slots (stream-K's larger products are bounded in stream_k_blocks). (m, n and k bounded too: the tile and stage
  // counts round them up, which must not overflow.)
  constexpr std::int64_t kMaxExtent = std::int64_t{1} << 62;
  TORCH_CHECK(m <= kMaxExtent && n <= kMaxExtent && k <= kMaxExtent,
              "plan_gemm_grid: arguments 'm', 'n' and 'k' must be at most 2^62, got m = ", m, ", n = ", n, ", k = ", k);
  TORCH_CHECK(std::ceil(static_cast<double>(m) / kGemmTile) * std::ceil(static_cast<double>(n) / kGemmTile) *
                  static_cast<double>(batch) <= 0x1p46,
              "plan_gemm_grid: the output's 128x128 tiles times 'batch' must be at most 2^46, got m = ", m, ", n = ", n,
              ", batch = ", batch);
  TORCH_CHECK(l2_bytes >= 0, "plan_gemm_grid: argument 'l2_bytes' must be non-negative, got ", l2_bytes);
  const int forced_splits = static_cast<int>(env_positive_number("TORCH_WMMAE_K_SPLITS", "splits of K", kMaxGridYZ));
  GemmGrid grid{};
  grid.tiles = gemm_tiles(m, n);
  grid.batch_slots = std::min(batch, kMaxGridYZ);
  const int sms = static_cast<int>(sm_count);
  const std::int64_t blocks = grid.tiles * grid.batch_slots;
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const bool long_k_grid =
      !deterministic && forced_splits == 0 && long_k_split_below_4_waves(blocks, m, n, k, sms, l2_bytes);
  grid.k_splits = deterministic         ? 1  // (see choose_k_splits)
                  : forced_splits > 0   ? nonempty_splits(k, forced_splits)
                  : long_k_grid         ? long_k_splits(k, l2_bytes)
                                        : choose_k_splits(blocks, k, sms, l2_bytes);
  grid.k_per_split = k_per_split(k, grid.k_splits);
  grid.persistent_batch_slots = persistent_batch_slots(grid, batch, k, sm_count);
  StreamK policy = stream_k_policy(forced_splits > 0);
  if (long_k_grid && policy == StreamK::kChoose) policy = StreamK::kNever;
  grid.stream_k_blocks = stream_k_blocks(grid.tiles * batch, m, n, k, grid.k_splits, sms, policy);
  grid.stream_k_gap =
      grid.stream_k_blocks > 0 ? stream_k_gap(grid.tiles * batch, gemm_k_stages(k), grid.stream_k_blocks) : 0;
  return grid;
}

int gemm_tile_group_rows(std::int64_t k, std::int64_t l2_bytes, std::int64_t k_splits) {
  TORCH_CHECK(k >= 0 && k <= (std::int64_t{1} << 62) && l2_bytes >= 0 && k_splits >= 1 && k_splits <= (1 << 20),
              "gemm_tile_group_rows: arguments 'k' and 'l2_bytes' must be non-negative ('k' at most 2^62) and "
              "'k_splits' a positive split count, got ", k, ", ", l2_bytes, " and ", k_splits);
  const std::int64_t k_piece = k_per_split(k, static_cast<int>(k_splits));
  // kMaxTileGroupRows x k_piece x kGemmTile floats <= 2/3 of l2_bytes, as a bound on k_piece (no product to
  // overflow)
  constexpr std::int64_t kBytesPerK = kMaxTileGroupRows * kGemmTile * static_cast<std::int64_t>(sizeof(float));
  return k_piece <= l2_bytes / (3 * kBytesPerK / 2) ? kMaxTileGroupRows : kMinTileGroupRows;
}

int launch_tile_group_rows(std::int64_t k, std::int64_t l2_bytes, std::int64_t k_splits) {
  const int rows = static_cast<int>(env_positive_number("TORCH_WMMAE_TILE_GROUP_ROWS", "tile rows per group", 1 << 20));
  return rows > 0 ? rows : gemm_tile_group_rows(k, l2_bytes, k_splits);
}

int long_k_splits(std::int64_t k, std::int64_t l2_bytes) {
  if (k <= kLongKSplitAboveK) return 1;
  for (int s = 2; s <= kMaxLongKSplits; ++s) {
    if (gemm_tile_group_rows(k, l2_bytes, s) == kMaxTileGroupRows) return nonempty_splits(k, s);
  }
  return 2;
}

std::vector<std::int64_t> stream_k_shares(std::int64_t tiles, std::int64_t k_stages, std::int64_t blocks) {
  TORCH_CHECK(tiles > 0 && k_stages > 0 && blocks > 0, "stream_k_shares: arguments 'tiles', 'k_stages' and "
              "'blocks' must be positive, got ", tiles, ", ", k_stages, ", ", blocks);
  // The CUDA op runs at most one block per SM; stream_k_share multiplies a block index by all units.
  TORCH_CHECK(blocks <= (1 << 20), "stream_k_shares: argument 'blocks' must be at most 2^20, got ", blocks);
  TORCH_CHECK(stream_k_units_fit(tiles, k_stages, blocks), "stream_k_shares: tiles x (k_stages + ",
              kStreamKCrossingStages, ") x blocks must be at most 2^62, got ", tiles, ", ", k_stages, " and ", blocks);
  const std::int64_t gap = stream_k_gap(tiles, k_stages, blocks);
  std::vector<std::int64_t> starts(blocks + 1);
  for (std::int64_t b = 0; b <= blocks; ++b) starts[b] = stream_k_share(b, blocks, tiles, k_stages, gap);
  return starts;
}

}  // namespace wmmae_ops
