// The scalar reference kernels: plain loops over the per-element functors of optimizer_math.h
// and core/dtype.h's conversions. Tests compare every SIMD target against these bit for bit, and
// set_simd_target("reference") makes steps use them.
#include <cstring>
#include <type_traits>

#include "core/assert.h"
#include "cpu/simd_kernels.h"

namespace tz::cpu::detail {
namespace {

template <class T>
inline float load(const void* base, std::size_t i) {
  return to_f32(static_cast<const T*>(base)[i]);
}
template <class T>
inline void store(void* base, std::size_t i, float x) {
  static_cast<T*>(base)[i] = from_f32<T>(x);
}
template <class CopyT>
inline void store_copy(void* base, std::size_t i, float x) {
  if constexpr (!std::is_same_v<CopyT, NoCopy>) store<CopyT>(base, i, x);
}

template <class G, class S, class C>
void adam_tile(const StepKernel& k, const Tile& t) {
  for (std::size_t i = 0; i < t.n; ++i) {
    float p = t.param[i];
    float m = load<S>(t.state[0], i);
    float v = load<S>(t.state[1], i);
    optim::adam_update(k.adam, load<G>(t.grad, i), p, m, v);
    t.param[i] = p;
    store<S>(t.state[0], i, m);
    store<S>(t.state[1], i, v);
    store_copy<C>(t.copy, i, p);
  }
}

template <class G, class C>
void sgd_tile(const StepKernel& k, const Tile& t) {
  const bool has_buf = k.sgd.momentum != 0.0f;
  for (std::size_t i = 0; i < t.n; ++i) {
    float p = t.param[i];
    float buf = has_buf ? static_cast<float*>(t.state[0])[i] : 0.0f;
    optim::sgd_update(k.sgd, load<G>(t.grad, i), p, buf);
    t.param[i] = p;
    if (has_buf) static_cast<float*>(t.state[0])[i] = buf;
    store_copy<C>(t.copy, i, p);
  }
}

template <class G, class C>
void lion_tile(const StepKernel& k, const Tile& t) {
  float* m = static_cast<float*>(t.state[0]);
  for (std::size_t i = 0; i < t.n; ++i) {
    float p = t.param[i];
    optim::lion_update(k.lion, load<G>(t.grad, i), p, m[i]);
    t.param[i] = p;
    store_copy<C>(t.copy, i, p);
  }
}

template <class G, class C>
void adagrad_tile(const StepKernel& k, const Tile& t) {
  float* sum = static_cast<float*>(t.state[0]);
  for (std::size_t i = 0; i < t.n; ++i) {
    float p = t.param[i];
    optim::adagrad_update(k.adagrad, load<G>(t.grad, i), p, sum[i]);
    t.param[i] = p;
    store_copy<C>(t.copy, i, p);
  }
}

void update_one(const StepKernel& k, const Tile& t) {
  with_value_type(k.grad_dtype, [&](auto g) {
    using G = decltype(g);
    with_copy_type(t.copy, k.copy_dtype, [&](auto c) {
      using C = decltype(c);
      switch (k.kind) {
        case optim::OptimizerKind::kAdam:
          if (k.state_dtype == DType::kBF16) {
            adam_tile<G, bf16, C>(k, t);
          } else {
            adam_tile<G, float, C>(k, t);
          }
          return;
        case optim::OptimizerKind::kSgd: sgd_tile<G, C>(k, t); return;
        case optim::OptimizerKind::kLion: lion_tile<G, C>(k, t); return;
        case optim::OptimizerKind::kAdagrad: adagrad_tile<G, C>(k, t); return;
      }
    });
  });
}

template <class G, class S, class C>
void stream_tile(const Tile& t) {
  for (std::size_t i = 0; i < t.n; ++i) {
    const float g = load<G>(t.grad, i);
    const float p = t.param[i] + g;
    t.param[i] = p;
    for (void* s : t.state) {
      if (s != nullptr) store<S>(s, i, load<S>(s, i) + g);
    }
    store_copy<C>(t.copy, i, p);
  }
}

void stream_one(const StreamKernel& k, const Tile& t) {
  with_value_type(k.grad_dtype, [&](auto g) {
    with_copy_type(t.copy, k.copy_dtype, [&](auto c) {
      if (k.state_dtype == DType::kBF16) {
        stream_tile<decltype(g), bf16, decltype(c)>(t);
      } else {
        stream_tile<decltype(g), float, decltype(c)>(t);
      }
    });
  });
}

void update(const StepKernel& k, const Tile* tiles, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) update_one(k, tiles[i]);
}

void stream(const StreamKernel& k, const Tile* tiles, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) stream_one(k, tiles[i]);
}

void f32_to_16(const float* in, void* out, DType out_dtype, std::size_t n) {
  TZ_ASSERT(out_dtype != DType::kF32);
  for (std::size_t i = 0; i < n; ++i) {
    if (out_dtype == DType::kBF16) {
      store<bf16>(out, i, in[i]);
    } else {
      store<fp16>(out, i, in[i]);
    }
  }
}

void from_16(const void* in, DType in_dtype, float* out, std::size_t n) {
  TZ_ASSERT(in_dtype != DType::kF32);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = in_dtype == DType::kBF16 ? load<bf16>(in, i) : load<fp16>(in, i);
  }
}

}  // namespace

const KernelTable& reference_kernels() {
  static const KernelTable table{"reference", &update, &stream, &f32_to_16, &from_16};
  return table;
}

}  // namespace tz::cpu::detail
