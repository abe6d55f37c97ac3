// CpuOptimizer: validation, per-step coefficients (computed in double, rounded once to float),
// tiling of a shard list and the parallel pass over the tiles on a pinned arena.
#include "cpu/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include "core/xxhash_dispatch.h"
#include "cpu/simd_kernels.h"
#include "cpu/topology.h"

namespace tz::cpu {
namespace detail {

// Where a tile lies in the shard list (its shard, its first element) and whether a chunk may
// start at it: a tile of a shard whose writes are hashed starts a chunk only where every hashed
// array's pieces start, so that one thread hashes each piece in order.
struct TileMeta {
  std::size_t shard = 0;
  std::size_t off = 0;
  bool hashed = false;
  bool chunk_start = true;
};

}  // namespace detail
namespace {

bool in_unit_interval(double x) { return x >= 0.0 && x < 1.0; }

Status validate_spec(const OptimizerSpec& s) {
  auto bad = [](const std::string& what) {
    return Status::invalid_argument("optimizer: " + what);
  };
  if (!(s.lr >= 0.0) || !std::isfinite(s.lr)) return bad("lr must be a finite value >= 0");
  if (!(s.weight_decay >= 0.0) || !std::isfinite(s.weight_decay)) {
    return bad("weight_decay must be a finite value >= 0");
  }
  switch (s.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kLion:
      if (!in_unit_interval(s.beta1) || !in_unit_interval(s.beta2)) {
        return bad("betas must lie in [0, 1)");
      }
      break;
    case OptimizerKind::kSgd:
      if (!(s.momentum >= 0.0) || !in_unit_interval(s.dampening) || s.dampening > 1.0) {
        return bad("SGD needs momentum >= 0 and dampening in [0, 1)");
      }
      if (s.nesterov && (s.momentum <= 0.0 || s.dampening != 0.0)) {
        return bad("Nesterov momentum requires momentum > 0 and dampening = 0");
      }
      break;
    case OptimizerKind::kAdagrad:
      if (!(s.lr_decay >= 0.0)) return bad("Adagrad lr_decay must be >= 0");
      break;
  }
  if ((s.kind == OptimizerKind::kAdam || s.kind == OptimizerKind::kAdagrad) && !(s.eps >= 0.0)) {
    return bad("eps must be >= 0");
  }
  if (s.state_dtype == DType::kF16) return bad("fp16 optimizer states are not supported");
  if (s.state_dtype == DType::kBF16 && s.kind != OptimizerKind::kAdam) {
    return bad("bf16 states are supported for Adam/AdamW only");
  }
  return Status::ok();
}

float to_float(double x) { return static_cast<float>(x); }

detail::StepKernel make_kernel(const OptimizerSpec& s, const StepArgs& a) {
  detail::StepKernel k;
  k.kind = s.kind;
  k.grad_dtype = a.grad_dtype;
  k.state_dtype = s.state_dtype;
  k.copy_dtype = a.copy_dtype;
  const StepCoeffs c = step_coeffs(s, a);
  k.adam = c.adam;
  k.sgd = c.sgd;
  k.lion = c.lion;
  k.adagrad = c.adagrad;
  return k;
}

Status validate_step(const OptimizerSpec& spec, std::span<const Shard> shards,
                     const StepArgs& args) {
  if (args.step < 1) {
    return Status::invalid_argument("step must be >= 1 (1-based), got " +
                                    std::to_string(args.step));
  }
  if (!std::isfinite(args.grad_multiplier)) {
    return Status::invalid_argument("grad_multiplier must be finite");
  }
  if (args.copy_dtype == DType::kF32) {
    return Status::invalid_argument("copy_dtype must be bf16 or fp16");
  }
  const int states = state_count(spec);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const Shard& s = shards[i];
    auto bad = [&](const char* what) {
      return Status::invalid_argument("shard " + std::to_string(i) + ": " + what);
    };
    if (s.n == 0) {
      // No tile would hash its block.
      const bool sums = s.param_sums.sums != nullptr || s.state_sums[0].sums != nullptr ||
                        s.state_sums[1].sums != nullptr || s.copy_sums.sums != nullptr;
      if (sums) return bad("sums of an empty shard");
      continue;
    }
    if (s.param == nullptr) return bad("param is null");
    if (s.grad == nullptr) return bad("grad is null");
    for (int j = 0; j < states; ++j) {
      if (s.state[j] == nullptr) return bad("an optimizer state buffer is null");
    }
    auto bad_sums = [&](const PieceSums& h, std::size_t elem) -> const char* {
      if (h.sums == nullptr) return nullptr;
      if (h.piece_bytes == 0 || h.piece_bytes % elem != 0) {
        return "piece_bytes must be a positive multiple of the element size";
      }
      if (h.block_bytes < s.n * elem) return "block_bytes is smaller than the shard";
      return nullptr;
    };
    const std::size_t ssize = dtype_size(spec.state_dtype);
    const char* why = bad_sums(s.param_sums, 4);
    for (int j = 0; j < 2 && why == nullptr; ++j) {
      if (s.state_sums[j].sums != nullptr && j >= states) return bad("sums of a state not kept");
      why = bad_sums(s.state_sums[j], ssize);
    }
    if (why == nullptr) {
      if (s.copy_sums.sums != nullptr && s.param_copy == nullptr) {
        return bad("sums of a missing param_copy");
      }
      why = bad_sums(s.copy_sums, dtype_size(args.copy_dtype));
    }
    if (why != nullptr) return bad(why);
  }
  return Status::ok();
}

// The element count that every hashed array's pieces of `s` start at multiples of (0: none
// hashed).
std::size_t hash_group(const Shard& s, std::size_t ssize, std::size_t csize) {
  std::size_t g = 0;
  auto add = [&g](const PieceSums& h, std::size_t elem) {
    if (h.sums == nullptr) return;
    const std::size_t e = h.piece_bytes / elem;
    g = g == 0 ? e : std::lcm(g, e);
  };
  add(s.param_sums, 4);
  add(s.state_sums[0], ssize);
  add(s.state_sums[1], ssize);
  add(s.copy_sums, csize);
  return g;
}

// Feeds the bytes that a tile of elements [off, off + n) wrote into one array to its pieces'
// hashes; the shard's last tile also feeds the block's bytes past its elements. Each piece ends
// in its sum; `st` carries a piece over the tiles of one chunk (a chunk starts at a piece).
void hash_written(const PieceSums& h, const void* array, std::size_t elem, std::size_t off,
                  std::size_t n, std::size_t shard_n, Xxh3Stream& st) {
  if (h.sums == nullptr) return;
  const auto* base = static_cast<const std::byte*>(array);
  std::size_t from = off * elem;
  const std::size_t to = off + n == shard_n ? h.block_bytes : (off + n) * elem;
  while (from < to) {
    const std::size_t k = from / h.piece_bytes;
    const std::size_t piece_end = std::min((k + 1) * h.piece_bytes, h.block_bytes);
    if (from == k * h.piece_bytes) st.reset();
    const std::size_t end = std::min(to, piece_end);
    st.update(base + from, end - from);
    if (end == piece_end) h.sums[k] = st.digest();
    from = end;
  }
}

// Splits shards into tiles of at most tile_elems elements (appended to `tiles`, and where they
// lie to `meta` when given: then a hashed shard's tiles end at its hash groups, step()).
void build_tiles(std::span<const Shard> shards, const StepArgs& args, const OptimizerSpec& spec,
                 std::size_t tile_elems, std::vector<detail::Tile>& tiles,
                 std::vector<detail::TileMeta>* meta = nullptr) {
  const std::size_t gsize = dtype_size(args.grad_dtype);
  const std::size_t ssize = dtype_size(spec.state_dtype);
  const std::size_t csize = dtype_size(args.copy_dtype);
  const int states = state_count(spec);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const Shard& s = shards[i];
    const std::size_t group = meta != nullptr ? hash_group(s, ssize, csize) : 0;
    for (std::size_t off = 0; off < s.n;) {
      detail::Tile t;
      t.n = std::min(tile_elems, s.n - off);
      if (group > 0) t.n = std::min(t.n, (off / group + 1) * group - off);
      if (meta != nullptr) meta->push_back({i, off, group > 0, group == 0 || off % group == 0});
      t.param = s.param + off;
      t.grad = static_cast<const char*>(s.grad) + off * gsize;
      for (int j = 0; j < states; ++j) t.state[j] = static_cast<char*>(s.state[j]) + off * ssize;
      if (s.param_copy != nullptr) t.copy = static_cast<char*>(s.param_copy) + off * csize;
      tiles.push_back(t);
      off += t.n;
    }
  }
}

}  // namespace

std::string_view optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kLion: return "lion";
    case OptimizerKind::kAdagrad: return "adagrad";
  }
  return "?";
}

OptimizerSpec OptimizerSpec::adamw(double lr, double weight_decay) {
  OptimizerSpec s;
  s.kind = OptimizerKind::kAdam;
  s.lr = lr;
  s.weight_decay = weight_decay;
  s.decoupled_weight_decay = true;
  return s;
}
OptimizerSpec OptimizerSpec::adam(double lr, double l2_weight_decay) {
  OptimizerSpec s = adamw(lr, l2_weight_decay);
  s.decoupled_weight_decay = false;
  return s;
}
OptimizerSpec OptimizerSpec::sgd(double lr, double momentum, bool nesterov) {
  OptimizerSpec s;
  s.kind = OptimizerKind::kSgd;
  s.lr = lr;
  s.momentum = momentum;
  s.nesterov = nesterov;
  return s;
}
OptimizerSpec OptimizerSpec::lion(double lr, double weight_decay) {
  OptimizerSpec s;
  s.kind = OptimizerKind::kLion;
  s.lr = lr;
  s.beta1 = 0.9;
  s.beta2 = 0.99;
  s.weight_decay = weight_decay;
  return s;
}
OptimizerSpec OptimizerSpec::adagrad(double lr, double lr_decay) {
  OptimizerSpec s;
  s.kind = OptimizerKind::kAdagrad;
  s.lr = lr;
  s.lr_decay = lr_decay;
  s.eps = 1e-10;
  return s;
}

Result<OptimizerSpec> spec_from_config(const Config& config) {
  const OptimizerConfig& o = config.optimizer;
  OptimizerSpec s;
  if (o.type == "Adam" || o.type == "AdamW") {
    s = OptimizerSpec::adamw(o.lr, o.weight_decay);
    // DeepSpeed's "Adam" with adam_w_mode=true is AdamW; "AdamW" is always decoupled.
    s.decoupled_weight_decay = o.type == "AdamW" || o.adam_w_mode;
    s.beta1 = o.betas[0];
    s.beta2 = o.betas[1];
    s.eps = o.eps;
    s.bias_correction = o.bias_correction;
  } else if (o.type == "SGD") {
    s = OptimizerSpec::sgd(o.lr, o.momentum, o.nesterov);
    s.weight_decay = o.weight_decay;
  } else if (o.type == "Lion") {
    s = OptimizerSpec::lion(o.lr, o.weight_decay);
    s.beta1 = o.betas[0];
    s.beta2 = o.betas[1];
  } else if (o.type == "Adagrad") {
    s = OptimizerSpec::adagrad(o.lr);
    s.eps = o.eps;
    s.weight_decay = o.weight_decay;
  } else {
    return Status::invalid_argument("optimizer.type '" + o.type +
                                    "' is not supported; accepted: Adam, AdamW, SGD, Lion, Adagrad");
  }
  const std::optional<DType> state = parse_dtype(config.tierzero.state_dtype);
  if (!state || *state == DType::kF16) {
    return Status::invalid_argument("tierzero.state_dtype '" + config.tierzero.state_dtype +
                                    "' is not supported; accepted: fp32, bf16");
  }
  s.state_dtype = *state;
  TZ_RETURN_IF_ERROR(validate_spec(s));
  return s;
}

int state_count(const OptimizerSpec& spec) {
  switch (spec.kind) {
    case OptimizerKind::kAdam: return 2;
    case OptimizerKind::kSgd: return spec.momentum != 0.0 ? 1 : 0;
    case OptimizerKind::kLion: return 1;
    case OptimizerKind::kAdagrad: return 1;
  }
  return 0;
}

std::size_t traffic_bytes_per_element(const OptimizerSpec& spec, DType grad_dtype, bool has_copy,
                                      DType copy_dtype) {
  return dtype_size(grad_dtype) + 2 * sizeof(float) +
         2 * static_cast<std::size_t>(state_count(spec)) * dtype_size(spec.state_dtype) +
         (has_copy ? dtype_size(copy_dtype) : 0);
}

struct CpuOptimizer::Impl {
  OptimizerSpec spec;
  OptimizerOptions options;
  ThreadArena arena;
  std::vector<detail::Tile> tiles;         // reused across steps
  std::vector<detail::TileMeta> meta;      // per tile: where it lies (build_tiles)
  std::vector<std::size_t> chunk_begin;    // tile index where each parallel chunk starts

  Impl(const OptimizerSpec& s, const OptimizerOptions& o, ThreadArena a)
      : spec(s), options(o), arena(std::move(a)) {}
};

Result<CpuOptimizer> CpuOptimizer::create(const OptimizerSpec& spec,
                                          const OptimizerOptions& options) {
  TZ_RETURN_IF_ERROR(validate_spec(spec));
  if (options.tile_elems < 64 || options.tile_elems % 64 != 0) {
    return Status::invalid_argument("tile_elems must be a multiple of 64 and >= 64, got " +
                                    std::to_string(options.tile_elems));
  }
  ArenaOptions ao;
  ao.threads = options.threads;
  ao.pin = options.pin_threads;
  ao.numa_node = options.numa_node;
  TZ_ASSIGN_OR_RETURN(ThreadArena arena, ThreadArena::create(ao));
  return CpuOptimizer(std::make_unique<Impl>(spec, options, std::move(arena)));
}

CpuOptimizer::CpuOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuOptimizer::CpuOptimizer(CpuOptimizer&&) noexcept = default;
CpuOptimizer& CpuOptimizer::operator=(CpuOptimizer&&) noexcept = default;
CpuOptimizer::~CpuOptimizer() = default;

const OptimizerSpec& CpuOptimizer::spec() const { return impl_->spec; }
int CpuOptimizer::threads() const { return impl_->arena.threads(); }

// Tiles the shards, groups the tiles into chunks and runs tile_fn(first, count) on each chunk of
// consecutive tiles (indices into im.tiles and im.meta) in the arena.
template <class TileFn>
static void run_tiled(CpuOptimizer::Impl& im, std::span<const Shard> shards, const StepArgs& args,
                      const TileFn& tile_fn);

Status CpuOptimizer::step(std::span<const Shard> shards, const StepArgs& args) {
  TZ_RETURN_IF_ERROR(validate_step(impl_->spec, shards, args));
  const detail::StepKernel kernel = make_kernel(impl_->spec, args);
  const detail::KernelTable& table = detail::active_kernels();
  Impl& im = *impl_;
  const std::size_t ssize = dtype_size(im.spec.state_dtype);
  const std::size_t csize = dtype_size(args.copy_dtype);
  run_tiled(im, shards, args, [&](std::size_t first, std::size_t count) {
    const detail::Tile* tiles = im.tiles.data();
    const std::size_t end = first + count;
    if (std::none_of(im.meta.begin() + first, im.meta.begin() + end,
                     [](const detail::TileMeta& m) { return m.hashed; })) {
      table.update(kernel, tiles + first, count);
      return;
    }
    // The hashes of the four arrays a tile writes, each carried over the tiles of a piece.
    Xxh3Stream st[4];
    for (std::size_t i = first; i < end;) {
      if (!im.meta[i].hashed) {
        std::size_t j = i + 1;
        while (j < end && !im.meta[j].hashed) ++j;
        table.update(kernel, tiles + i, j - i);
        i = j;
        continue;
      }
      // One tile, then its bytes hashed while they are in cache.
      table.update(kernel, tiles + i, 1);
      const Shard& s = shards[im.meta[i].shard];
      const std::size_t off = im.meta[i].off;
      const std::size_t n = tiles[i].n;
      hash_written(s.param_sums, s.param, 4, off, n, s.n, st[0]);
      for (int j = 0; j < 2; ++j) {
        hash_written(s.state_sums[j], s.state[j], ssize, off, n, s.n, st[1 + j]);
      }
      hash_written(s.copy_sums, s.param_copy, csize, off, n, s.n, st[3]);
      ++i;
    }
  });
  return Status::ok();
}

Status CpuOptimizer::stream(std::span<const Shard> shards, const StepArgs& args) {
  TZ_RETURN_IF_ERROR(validate_step(impl_->spec, shards, args));
  detail::StreamKernel kernel;
  kernel.grad_dtype = args.grad_dtype;
  kernel.state_dtype = impl_->spec.state_dtype;
  kernel.copy_dtype = args.copy_dtype;
  const detail::KernelTable& table = detail::active_kernels();
  run_tiled(*impl_, shards, args, [&](std::size_t first, std::size_t count) {
    table.stream(kernel, impl_->tiles.data() + first, count);
  });
  return Status::ok();
}

template <class TileFn>
static void run_tiled(CpuOptimizer::Impl& im, std::span<const Shard> shards, const StepArgs& args,
                      const TileFn& tile_fn) {
  im.tiles.clear();
  im.meta.clear();
  build_tiles(shards, args, im.spec, im.options.tile_elems, im.tiles, &im.meta);
  if (im.tiles.empty()) return;

  // Chunks of roughly equal element counts (several per thread, so a thread slowed by a noisy
  // neighbour sheds work), each a run of consecutive tiles. Small shards share a chunk, so
  // per-tensor overhead is one tile call, not one task.
  std::size_t total = 0;
  for (const detail::Tile& t : im.tiles) total += t.n;
  const std::size_t threads = static_cast<std::size_t>(im.arena.threads());
  const std::size_t want = std::min(im.tiles.size(), threads == 1 ? 1 : threads * 4);
  im.chunk_begin.clear();
  im.chunk_begin.push_back(0);
  std::size_t acc = 0;
  for (std::size_t i = 0; i < im.tiles.size(); ++i) {
    const std::size_t next_boundary = total * im.chunk_begin.size() / want;
    if (acc >= next_boundary && i > im.chunk_begin.back() && im.meta[i].chunk_start) {
      im.chunk_begin.push_back(i);
    }
    acc += im.tiles[i].n;
  }
  im.chunk_begin.push_back(im.tiles.size());
  const std::size_t chunks = im.chunk_begin.size() - 1;

  // One kernel call per chunk: the dtype dispatch and coefficient setup are paid per chunk.
  auto run_chunk = [&](std::size_t c) {
    tile_fn(im.chunk_begin[c], im.chunk_begin[c + 1] - im.chunk_begin[c]);
  };
  im.arena.execute([&] {
    if (chunks == 1) {
      run_chunk(0);
      return;
    }
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, chunks, 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          for (std::size_t c = r.begin(); c != r.end(); ++c) run_chunk(c);
        },
        tbb::simple_partitioner());
  });
}

Status reference_step(const OptimizerSpec& spec, std::span<const Shard> shards,
                      const StepArgs& args) {
  TZ_RETURN_IF_ERROR(validate_spec(spec));
  TZ_RETURN_IF_ERROR(validate_step(spec, shards, args));
  const detail::StepKernel kernel = make_kernel(spec, args);
  std::vector<detail::Tile> tiles;
  build_tiles(shards, args, spec, std::size_t{1} << 20, tiles);
  detail::reference_kernels().update(kernel, tiles.data(), tiles.size());
  return Status::ok();
}

StepCoeffs step_coeffs(const OptimizerSpec& s, const StepArgs& a) {
  StepCoeffs k;
  const double lr = a.lr_override >= 0.0 ? a.lr_override : s.lr;
  const double t = static_cast<double>(a.step);
  switch (s.kind) {
    case OptimizerKind::kAdam: {
      optim::AdamCoeffs& c = k.adam;
      c.grad_scale = a.grad_multiplier;
      c.beta1 = to_float(s.beta1);
      c.beta2 = to_float(s.beta2);
      // 1 - beta is exact in float for beta in [0.5, 1) (Sterbenz); computing it from the float
      // beta keeps m and v convex combinations of the float coefficients the user sees.
      c.one_minus_beta1 = to_float(1.0 - static_cast<double>(c.beta1));
      c.one_minus_beta2 = to_float(1.0 - static_cast<double>(c.beta2));
      c.eps = to_float(s.eps);
      if (s.bias_correction) {
        c.step_size = to_float(lr / (1.0 - std::pow(static_cast<double>(c.beta1), t)));
        c.sqrt_bias_correction2 =
            to_float(std::sqrt(1.0 - std::pow(static_cast<double>(c.beta2), t)));
      } else {
        c.step_size = to_float(lr);
        c.sqrt_bias_correction2 = 1.0f;
      }
      if (s.decoupled_weight_decay) {
        c.l2_decay = 0.0f;
        c.param_scale = to_float(1.0 - lr * s.weight_decay);
      } else {
        c.l2_decay = to_float(s.weight_decay);
        c.param_scale = 1.0f;
      }
      break;
    }
    case OptimizerKind::kSgd: {
      optim::SgdCoeffs& c = k.sgd;
      c.grad_scale = a.grad_multiplier;
      c.lr = to_float(lr);
      c.momentum = to_float(s.momentum);
      c.dampening_complement = to_float(1.0 - s.dampening);
      c.weight_decay = to_float(s.weight_decay);
      c.nesterov = s.nesterov;
      c.first_step = a.step == 1;
      break;
    }
    case OptimizerKind::kLion: {
      optim::LionCoeffs& c = k.lion;
      c.grad_scale = a.grad_multiplier;
      c.lr = to_float(lr);
      c.beta1 = to_float(s.beta1);
      c.beta2 = to_float(s.beta2);
      c.one_minus_beta1 = to_float(1.0 - static_cast<double>(c.beta1));
      c.one_minus_beta2 = to_float(1.0 - static_cast<double>(c.beta2));
      c.param_scale = to_float(1.0 - lr * s.weight_decay);
      break;
    }
    case OptimizerKind::kAdagrad: {
      optim::AdagradCoeffs& c = k.adagrad;
      c.grad_scale = a.grad_multiplier;
      c.clr = to_float(lr / (1.0 + (t - 1.0) * s.lr_decay));
      c.eps = to_float(s.eps);
      c.weight_decay = to_float(s.weight_decay);
      break;
    }
  }
  return k;
}

}  // namespace tz::cpu
