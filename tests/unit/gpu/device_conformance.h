// Backend-independent checks of the Device contract (memory budget, copies, typed operations
// against float64 references, stream/event ordering), written against Device& and host copies
// only, so the same checks run on HostDevice (tests/unit/gpu) and on CudaDevice (tests/gpu).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/dtype_element.h"
#include "cpu/optimizer_math.h"
#include "gpu/device.h"
#include "gpu/elementwise.h"

namespace tz::gpu::testing {

inline std::uint32_t test_seed() {
  static const std::uint32_t seed = [] {
    const std::uint32_t s = static_cast<std::uint32_t>(std::random_device{}());
    std::printf("device conformance seed: %u\n", s);
    return s;
  }();
  return seed;
}

// Values that exercise rounding, specials and fp16 subnormals.
inline std::vector<float> sample_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = uniform(rng) * std::ldexp(1.0f, static_cast<int>(i % 20) - 10);
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 70000.0f, 1e-7f, -3e-5f,
                            1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
  for (std::size_t i = 0; i < sizeof(specials) / sizeof(float) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

// Host-side encoding of fp32 values as `dtype` (the independent per-element reference is
// core/dtype.h's scalar conversions through core/dtype_element.h, not the device loops under test).
inline std::vector<std::uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint8_t> out(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) store_element(out.data(), dtype, i, values[i]);
  return out;
}

inline float decode_one(const std::uint8_t* p, DType dtype) { return load_element(p, dtype, 0); }

inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

// Host -> device -> host through the device's own copy streams.
inline std::vector<std::uint8_t> round_trip(Device& device, const std::vector<std::uint8_t>& in) {
  auto buf = device.allocate(in.size());
  EXPECT_TRUE(buf.is_ok()) << buf.status().to_string();
  std::vector<std::uint8_t> out(in.size(), 0);
  EXPECT_TRUE(device.copy_async(buf->data(), in.data(), in.size(), CopyKind::kHostToDevice,
                                device.compute_stream()).is_ok());
  EXPECT_TRUE(device.copy_async(out.data(), buf->data(), in.size(), CopyKind::kDeviceToHost,
                                device.compute_stream()).is_ok());
  EXPECT_TRUE(device.compute_stream().synchronize().is_ok());
  return out;
}

inline void check_budget_exact(Device& device) {
  const MemoryStats before = device.memory_stats();
  ASSERT_EQ(before.in_use_bytes, 0u);
  const std::uint64_t budget = before.budget_bytes;
  device.reset_peak();
  // A seeded random sequence of allocations and frees, mirrored by a plain reference model.
  std::mt19937 rng(test_seed());
  std::vector<DeviceBuffer> live;
  std::uint64_t ref_in_use = 0;
  std::uint64_t ref_peak = 0;
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const std::size_t k = rng() % live.size();
      ref_in_use -= live[k].size_bytes();
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const std::size_t bytes = 1 + rng() % (budget / 8);
      Result<DeviceBuffer> b = device.allocate(bytes);
      if (ref_in_use + bytes <= budget) {
        ASSERT_TRUE(b.is_ok()) << "seed " << test_seed() << ": " << b.status().to_string();
        ASSERT_EQ(reinterpret_cast<std::uintptr_t>(b->data()) % 256, 0u);
        ref_in_use += bytes;
        ref_peak = std::max(ref_peak, ref_in_use);
        live.push_back(std::move(*b));
      } else {
        ASSERT_FALSE(b.is_ok()) << "seed " << test_seed() << ": allocation past the budget";
        EXPECT_EQ(b.status().code(), ErrorCode::kOutOfMemory);
        const std::string& msg = b.status().message();
        EXPECT_NE(msg.find(std::to_string(bytes) + " B"), std::string::npos) << msg;
        EXPECT_NE(msg.find("in use " + std::to_string(ref_in_use)), std::string::npos) << msg;
        EXPECT_NE(msg.find("budget " + std::to_string(budget)), std::string::npos) << msg;
      }
    }
    const MemoryStats s = device.memory_stats();
    ASSERT_EQ(s.in_use_bytes, ref_in_use) << "seed " << test_seed();
    ASSERT_EQ(s.peak_bytes, ref_peak) << "seed " << test_seed();
    ASSERT_LE(s.peak_bytes, budget);
  }
  live.clear();
  EXPECT_EQ(device.memory_stats().in_use_bytes, 0u);
  EXPECT_EQ(device.memory_stats().peak_bytes, ref_peak);
  // Exactly the budget fits; one byte more does not.
  {
    auto all = device.allocate(budget);
    ASSERT_TRUE(all.is_ok()) << all.status().to_string();
    auto one = device.allocate(1);
    EXPECT_FALSE(one.is_ok());
  }
  EXPECT_EQ(device.memory_stats().peak_bytes, budget);
}

inline void check_copies(Device& device) {
  const std::size_t n = 1 << 20 | 123;
  std::vector<std::uint8_t> in(n);
  std::mt19937 rng(test_seed());
  for (auto& b : in) b = static_cast<std::uint8_t>(rng());
  auto a = device.allocate(n);
  auto b = device.allocate(n);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  std::vector<std::uint8_t> out(n, 0);
  Stream& s = device.compute_stream();
  ASSERT_TRUE(device.copy_async(a->data(), in.data(), n, CopyKind::kHostToDevice, s).is_ok());
  ASSERT_TRUE(device.copy_async(b->data(), a->data(), n, CopyKind::kDeviceToDevice, s).is_ok());
  ASSERT_TRUE(device.memset_async(a->data(), 0x5a, n, s).is_ok());
  ASSERT_TRUE(device.copy_async(out.data(), b->data(), n, CopyKind::kDeviceToHost, s).is_ok());
  ASSERT_TRUE(s.synchronize().is_ok());
  EXPECT_EQ(out, in) << "seed " << test_seed();
  ASSERT_TRUE(device.copy_async(out.data(), a->data(), n, CopyKind::kDeviceToHost, s).is_ok());
  ASSERT_TRUE(s.synchronize().is_ok());
  EXPECT_EQ(out, std::vector<std::uint8_t>(n, 0x5a));
}

inline void check_fill(Device& device) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float value : {0.0f, -1.5f, 3.14159f, 1e-6f, 1e6f}) {
      const std::size_t n = 1000 + 37;
      auto buf = device.allocate(n * dtype_size(t));
      ASSERT_TRUE(buf.is_ok());
      ASSERT_TRUE(device.fill(buf->data(), t, n, value, device.compute_stream()).is_ok());
      std::vector<std::uint8_t> out(n * dtype_size(t));
      ASSERT_TRUE(device.copy_async(out.data(), buf->data(), out.size(), CopyKind::kDeviceToHost,
                                    device.compute_stream()).is_ok());
      ASSERT_TRUE(device.compute_stream().synchronize().is_ok());
      const std::vector<std::uint8_t> ref = encode(std::vector<float>(n, value), t);
      EXPECT_EQ(out, ref) << dtype_name(t) << " fill " << value;
    }
  }
}

inline void check_cast(Device& device) {
  const std::size_t n = 4099;
  const std::vector<float> values = sample_values(n, test_seed());
  for (DType src_t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType dst_t : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::vector<std::uint8_t> src = encode(values, src_t);
      auto dsrc = device.allocate(src.size());
      auto ddst = device.allocate(n * dtype_size(dst_t));
      ASSERT_TRUE(dsrc.is_ok() && ddst.is_ok());
      Stream& s = device.compute_stream();
      ASSERT_TRUE(device.copy_async(dsrc->data(), src.data(), src.size(), CopyKind::kHostToDevice, s).is_ok());
      ASSERT_TRUE(device.cast(dsrc->data(), src_t, ddst->data(), dst_t, n, s).is_ok());
      std::vector<std::uint8_t> out(n * dtype_size(dst_t));
      ASSERT_TRUE(device.copy_async(out.data(), ddst->data(), out.size(), CopyKind::kDeviceToHost, s).is_ok());
      ASSERT_TRUE(s.synchronize().is_ok());
      // Reference: decode the source element to fp32, encode as the destination type.
      std::vector<float> decoded(n);
      for (std::size_t i = 0; i < n; ++i) decoded[i] = decode_one(&src[i * dtype_size(src_t)], src_t);
      const std::vector<std::uint8_t> ref = encode(decoded, dst_t);
      EXPECT_EQ(out, ref) << "cast " << dtype_name(src_t) << " -> " << dtype_name(dst_t)
                          << " seed " << test_seed();
    }
  }
}

inline void check_scale(Device& device) {
  const std::size_t n = 3001;
  const std::vector<float> values = sample_values(n, test_seed() + 1);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float factor : {0.5f, -3.0f, 1.0f / 3.0f, 1024.0f}) {
      const std::vector<std::uint8_t> in = encode(values, t);
      auto d = device.allocate(in.size());
      ASSERT_TRUE(d.is_ok());
      Stream& s = device.compute_stream();
      ASSERT_TRUE(device.copy_async(d->data(), in.data(), in.size(), CopyKind::kHostToDevice, s).is_ok());
      ASSERT_TRUE(device.scale(d->data(), t, n, factor, s).is_ok());
      std::vector<std::uint8_t> out(in.size());
      ASSERT_TRUE(device.copy_async(out.data(), d->data(), out.size(), CopyKind::kDeviceToHost, s).is_ok());
      ASSERT_TRUE(s.synchronize().is_ok());
      for (std::size_t i = 0; i < n; ++i) {
        const float x = decode_one(&in[i * dtype_size(t)], t);
        // fp32 product of two floats is the exactly rounded double product.
        const float prod = static_cast<float>(static_cast<double>(x) * static_cast<double>(factor));
        const float ref = decode_one(encode({prod}, t).data(), t);
        const float got = decode_one(&out[i * dtype_size(t)], t);
        ASSERT_TRUE(same_float(got, ref)) << dtype_name(t) << " scale " << factor << " x=" << x
                                          << " got " << got << " want " << ref << " i=" << i
                                          << " seed " << test_seed();
      }
    }
  }
}

inline void check_sum_squares(Device& device) {
  const std::size_t n = 100003;
  std::vector<float> values = sample_values(n, test_seed() + 2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int with_specials = 0; with_specials < 2; ++with_specials) {
      std::vector<float> v = values;
      if (with_specials) {
        v[5] = std::numeric_limits<float>::infinity();
        v[n - 1] = std::numeric_limits<float>::quiet_NaN();
        v[n / 2] = -std::numeric_limits<float>::infinity();
      }
      const std::vector<std::uint8_t> in = encode(v, t);
      double ref = 0;
      std::uint64_t ref_bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double x = decode_one(&in[i * dtype_size(t)], t);
        if (std::isfinite(x)) ref += x * x; else ++ref_bad;
      }
      auto d = device.allocate(in.size());
      auto acc = device.allocate(sizeof(NormAccumulator));
      ASSERT_TRUE(d.is_ok() && acc.is_ok());
      Stream& s = device.compute_stream();
      ASSERT_TRUE(device.copy_async(d->data(), in.data(), in.size(), CopyKind::kHostToDevice, s).is_ok());
      ASSERT_TRUE(device.memset_async(acc->data(), 0, sizeof(NormAccumulator), s).is_ok());
      // Two calls over halves accumulate into the same accumulator.
      const std::size_t half = n / 2;
      ASSERT_TRUE(device.sum_squares(d->data(), t, half, acc->as<NormAccumulator>(), s).is_ok());
      ASSERT_TRUE(device.sum_squares(d->as<std::uint8_t>() + half * dtype_size(t), t, n - half,
                                     acc->as<NormAccumulator>(), s).is_ok());
      NormAccumulator got;
      ASSERT_TRUE(device.copy_async(&got, acc->data(), sizeof(got), CopyKind::kDeviceToHost, s).is_ok());
      ASSERT_TRUE(s.synchronize().is_ok());
      EXPECT_EQ(got.nonfinite_count, ref_bad) << dtype_name(t);
      EXPECT_NEAR(got.sum_squares, ref, 1e-12 * ref + 1e-300) << dtype_name(t) << " seed " << test_seed();
    }
  }
}

// The sum of squares in gpu/elementwise.h's fixed order, written here from its description: the
// device's result must equal it bit for bit (fp64), and so equal the host's form
// (sum_squares_fixed_order), for a size of several chunks and more chunks than lanes.
inline double fixed_order_reference(const std::vector<std::uint8_t>& in, DType t, std::size_t n,
                                    std::uint64_t& bad) {
  auto tree = [](std::vector<double> v) {
    for (std::size_t width = v.size(); width > 1;) {
      width /= 2;
      for (std::size_t l = 0; l < width; ++l) v[l] += v[l + width];
    }
    return v[0];
  };
  std::vector<double> chunk_lanes(kNormLanes, 0.0);
  std::vector<double> total_lanes(kNormLanes, 0.0);
  const std::size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  for (std::size_t c = 0; c < chunks; ++c) {
    std::fill(chunk_lanes.begin(), chunk_lanes.end(), 0.0);
    for (std::size_t l = 0; l < kNormLanes; ++l) {
      for (std::size_t i = c * kNormChunk + l; i < std::min(n, (c + 1) * kNormChunk);
           i += kNormLanes) {
        const double x = decode_one(&in[i * dtype_size(t)], t);
        if (std::isfinite(x)) chunk_lanes[l] += x * x; else ++bad;
      }
    }
    total_lanes[c % kNormLanes] += tree(chunk_lanes);
  }
  return tree(total_lanes);
}

inline void check_sum_squares_fixed_order(Device& device) {
  const std::size_t n = kNormChunk * kNormLanes * 2 + 12345;  // 3 rounds of chunks per lane
  std::vector<float> values = sample_values(n, test_seed() + 3);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::vector<std::uint8_t> in = encode(values, t);
    std::uint64_t ref_bad = 0;
    const double ref = fixed_order_reference(in, t, n, ref_bad);
    NormAccumulator host;
    sum_squares_fixed_order(in.data(), t, n, host);
    EXPECT_EQ(host.sum_squares, ref) << dtype_name(t);
    EXPECT_EQ(host.nonfinite_count, ref_bad) << dtype_name(t);
    auto d = device.allocate(in.size());
    auto acc = device.allocate(sizeof(NormAccumulator));
    ASSERT_TRUE(d.is_ok() && acc.is_ok());
    Stream& s = device.compute_stream();
    ASSERT_TRUE(device.copy_async(d->data(), in.data(), in.size(), CopyKind::kHostToDevice, s).is_ok());
    for (int run = 0; run < 3; ++run) {  // the same bits every run
      ASSERT_TRUE(device.memset_async(acc->data(), 0, sizeof(NormAccumulator), s).is_ok());
      ASSERT_TRUE(device.sum_squares(d->data(), t, n, acc->as<NormAccumulator>(), s).is_ok());
      NormAccumulator got;
      ASSERT_TRUE(device.copy_async(&got, acc->data(), sizeof(got), CopyKind::kDeviceToHost, s).is_ok());
      ASSERT_TRUE(s.synchronize().is_ok());
      EXPECT_EQ(got.sum_squares, ref) << dtype_name(t) << " run " << run << " seed " << test_seed();
      EXPECT_EQ(got.nonfinite_count, ref_bad) << dtype_name(t);
    }
  }
}

// An operation enqueued behind an event must not run before the event's work: stream A is held
// by a gate, B waits on A's event; B's copy must still see the old value while the gate is shut.
inline void check_event_ordering(Device& device) {
  auto a = device.create_stream("a");
  auto b = device.create_stream("b");
  auto ev = device.create_event();
  ASSERT_TRUE(a.is_ok() && b.is_ok() && ev.is_ok());
  auto x = device.allocate(sizeof(std::uint32_t));
  auto y = device.allocate(sizeof(std::uint32_t));
  ASSERT_TRUE(x.is_ok() && y.is_ok());
  ASSERT_TRUE(device.memset_async(x->data(), 0, 4, **a).is_ok());
  ASSERT_TRUE(device.memset_async(y->data(), 0, 4, **a).is_ok());
  ASSERT_TRUE((*a)->synchronize().is_ok());

  // Unrecorded events are complete; waiting on them is a no-op.
  EXPECT_TRUE(*(*ev)->query());
  ASSERT_TRUE((*b)->wait(**ev).is_ok());

  std::atomic<bool> gate{false};
  ASSERT_TRUE(device.host_callback(**a, [&gate] {
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }).is_ok());
  ASSERT_TRUE(device.memset_async(x->data(), 0x11, 4, **a).is_ok());
  ASSERT_TRUE((*ev)->record(**a).is_ok());
  ASSERT_TRUE((*b)->wait(**ev).is_ok());
  ASSERT_TRUE(device.copy_async(y->data(), x->data(), 4, CopyKind::kDeviceToDevice, **b).is_ok());
  // Pinned (registered) host memory, so that the CUDA copy is truly asynchronous.
  auto* seen_page = static_cast<std::uint32_t*>(std::aligned_alloc(4096, 4096));
  ASSERT_NE(seen_page, nullptr);
  ASSERT_TRUE(device.register_host_memory(seen_page, 4096).is_ok());
  *seen_page = 0xffffffffu;
  ASSERT_TRUE(device.copy_async(seen_page, y->data(), 4, CopyKind::kDeviceToHost, **b).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(*(*ev)->query()) << "event completed while its stream is blocked";
  EXPECT_EQ(*seen_page, 0xffffffffu) << "stream b ran past its wait";
  gate.store(true);
  ASSERT_TRUE((*b)->synchronize().is_ok());
  EXPECT_TRUE(*(*ev)->query());
  EXPECT_EQ(*seen_page, 0x11111111u) << "stream b's copy ran before the event's work";
  ASSERT_TRUE((*a)->synchronize().is_ok());
  ASSERT_TRUE(device.unregister_host_memory(seen_page).is_ok());
  std::free(seen_page);
}

// Host callbacks on one stream run in order, after the work before them.
inline void check_callback_order(Device& device) {
  auto s = device.create_stream("cb");
  ASSERT_TRUE(s.is_ok());
  std::vector<int> order;
  std::mutex mu;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(device.host_callback(**s, [&order, &mu, i] {
      std::lock_guard lock(mu);
      order.push_back(i);
    }).is_ok());
  }
  ASSERT_TRUE((*s)->synchronize().is_ok());
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}


// The optimizer step gives the same bits as the shared functors of cpu/optimizer_math.h applied
// on the host (the CPU optimizer's math), for every optimizer, gradient dtype and copy dtype,
// over three steps.
inline void check_optimizer_step_matches_shared_functors(Device& device, std::size_t n = 2053) {
  std::mt19937 rng(test_seed() + 3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto kind : {optim::OptimizerKind::kAdam, optim::OptimizerKind::kSgd,
                    optim::OptimizerKind::kLion, optim::OptimizerKind::kAdagrad}) {
    for (DType grad_t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int copy_mode = 0; copy_mode < 3; ++copy_mode) {  // none, bf16, fp16
        const DType copy_t = copy_mode == 2 ? DType::kF16 : DType::kBF16;
        std::vector<float> p(n), s0(n, 0.0f), s1(n, 0.0f);
        for (auto& x : p) x = normal(rng);
        if (kind == optim::OptimizerKind::kAdagrad) std::fill(s0.begin(), s0.end(), 0.1f);
        OptimizerStepArgs args;
        args.kind = kind;
        args.adam.step_size = 1e-2f;
        args.adam.sqrt_bias_correction2 = 0.0316f;
        args.adam.param_scale = 0.999f;
        args.sgd.lr = 0.05f;
        args.sgd.momentum = 0.9f;
        args.sgd.weight_decay = 1e-3f;
        args.lion.lr = 1e-3f;
        args.lion.param_scale = 0.9999f;
        args.adagrad.clr = 0.05f;
        args.grad_dtype = grad_t;
        args.copy_dtype = copy_t;
        args.n = n;
        auto dp = device.allocate(n * 4), d0 = device.allocate(n * 4), d1 = device.allocate(n * 4);
        auto dg = device.allocate(n * 4), dc = device.allocate(n * 2);
        ASSERT_TRUE(dp.is_ok() && d0.is_ok() && d1.is_ok() && dg.is_ok() && dc.is_ok());
        Stream& st = device.compute_stream();
        ASSERT_TRUE(device.copy_async(dp->data(), p.data(), n * 4, CopyKind::kHostToDevice, st).is_ok());
        ASSERT_TRUE(device.copy_async(d0->data(), s0.data(), n * 4, CopyKind::kHostToDevice, st).is_ok());
        ASSERT_TRUE(device.copy_async(d1->data(), s1.data(), n * 4, CopyKind::kHostToDevice, st).is_ok());
        args.param = dp->as<float>();
        args.grad = dg->data();
        args.state[0] = d0->as<float>();
        args.state[1] = d1->as<float>();
        args.param_copy = copy_mode == 0 ? nullptr : dc->data();
        std::vector<std::uint8_t> ref_copy(n * 2);
        for (int step = 1; step <= 3; ++step) {
          std::vector<float> g(n);
          for (auto& x : g) x = normal(rng) * 0.1f;
          if (step == 2) g[7] = 0.0f;
          const std::vector<std::uint8_t> genc = encode(g, grad_t);
          ASSERT_TRUE(device.copy_async(dg->data(), genc.data(), genc.size(), CopyKind::kHostToDevice, st).is_ok());
          args.sgd.first_step = step == 1;
          ASSERT_TRUE(device.optimizer_step(args, st).is_ok());
          ASSERT_TRUE(st.synchronize().is_ok());  // genc and the next upload must not race
          for (std::size_t i = 0; i < n; ++i) {
            const float gi = decode_one(&genc[i * dtype_size(grad_t)], grad_t);
            optim::SgdCoeffs sgd = args.sgd;
            switch (kind) {
              case optim::OptimizerKind::kAdam: optim::adam_update(args.adam, gi, p[i], s0[i], s1[i]); break;
              case optim::OptimizerKind::kSgd: optim::sgd_update(sgd, gi, p[i], s0[i]); break;
              case optim::OptimizerKind::kLion: optim::lion_update(args.lion, gi, p[i], s0[i]); break;
              case optim::OptimizerKind::kAdagrad: optim::adagrad_update(args.adagrad, gi, p[i], s0[i]); break;
            }
          }
        }
        std::vector<float> got_p(n), got_s0(n);
        std::vector<std::uint8_t> got_c(n * 2);
        ASSERT_TRUE(device.copy_async(got_p.data(), dp->data(), n * 4, CopyKind::kDeviceToHost, st).is_ok());
        ASSERT_TRUE(device.copy_async(got_s0.data(), d0->data(), n * 4, CopyKind::kDeviceToHost, st).is_ok());
        ASSERT_TRUE(device.copy_async(got_c.data(), dc->data(), n * 2, CopyKind::kDeviceToHost, st).is_ok());
        ASSERT_TRUE(st.synchronize().is_ok());
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(same_float(got_p[i], p[i]))
              << "optimizer " << static_cast<int>(kind) << " grad " << dtype_name(grad_t) << " i=" << i
              << " got " << got_p[i] << " want " << p[i] << " seed " << test_seed();
          ASSERT_TRUE(same_float(got_s0[i], s0[i])) << "state0 i=" << i;
        }
        if (copy_mode != 0) {
          EXPECT_EQ(got_c, encode(p, copy_t)) << "16-bit copy of the new parameters";
        }
      }
    }
  }
  OptimizerStepArgs missing;
  missing.n = 4;
  float x = 0;
  missing.param = &x;
  missing.grad = &x;
  EXPECT_EQ(device.optimizer_step(missing, device.compute_stream()).code(),
            ErrorCode::kInvalidArgument) << "Adam without states accepted";
}

}  // namespace tz::gpu::testing
