// Highway SIMD tile kernels for the CPU optimizers, the bandwidth-ceiling stream kernel and the
// 16-bit conversions, compiled once per x86 target (EMU128, SSE4, AVX2, AVX3) by re-including
// this file through foreach_target.h; the HWY_ONCE part picks the table the CPU supports.
//
// Every kernel mirrors the scalar functors of optimizer_math.h operation for operation (separate
// Mul and Add, IEEE Div and Sqrt, no FMA but the exact-remainder correction of div_by_constant,
// which rounds as the division does; the module is built with -ffp-contract=off), and the
// 16-bit conversions are integer re-implementations of core/dtype.h's, so all targets produce
// the same bits as the scalar reference. Tails shorter than a vector go through a zero-padded
// stack buffer, so there is no scalar tail loop whose rounding could differ.

// Compile the scalar baseline and SSE4 besides AVX2 and AVX-512; skip SSSE3 (no machine we run
// on stops there) and AVX3_DL (it adds nothing this math uses) to keep the build short.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/simd_kernels.h"

HWY_BEFORE_NAMESPACE();
// The AVX3 target's code may also use AVX512-BF16 (Highway 1.0 has no target with it): only the
// bf16 pair store below does, and only after checking the CPU has it. Nothing else here has a
// bf16 type for the compiler to convert on its own, so the code stays valid on AVX-512 CPUs
// without it. HWY_AFTER_NAMESPACE's pop_options ends it.
#undef TZ_CPU_NATIVE_BF16
#if HWY_TARGET == HWY_AVX3 && defined(__GNUC__) && !defined(__clang__)  // GCC's target pragma
#pragma GCC target("avx512bf16")
#define TZ_CPU_NATIVE_BF16 1
#else
#define TZ_CPU_NATIVE_BF16 0
#endif
namespace tz::cpu::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<D>;
using DI = hn::RebindToSigned<D>;
using D16 = hn::Rebind<std::uint16_t, D>;
using V = hn::Vec<D>;
using VU = hn::Vec<DU>;

// Attributes of every per-vector tile body (a lambda the tile driver calls from its vector loop
// and once more for the padded tail). Without always_inline GCC keeps a body with 16-bit
// conversions out of line: each vector then pays a call and rebuilds its constants from
// immediates, which on AVX2 held fp16 and bf16-state updates to 0.4-0.7 of their ceiling.
#define TZ_TILE_BODY HWY_ATTR __attribute__((always_inline))

// x86 targets from AVX2 up have F16C (Highway's AVX2 target requires it): fp16 conversions are
// one instruction there instead of a dozen integer operations. (Redefined per target: this
// file is included once for each.)
#undef TZ_CPU_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
#define TZ_CPU_F16C 1
#else
#define TZ_CPU_F16C 0
#endif

// ---- loads and stores with conversion (bit-identical to core/dtype.h) ----

#if TZ_CPU_NATIVE_BF16
// Whether this CPU has AVX512-BF16 (VCVTNE2PS2BF16), asked once.
HWY_INLINE bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#endif

HWY_INLINE V load(D d, const float* p) { return hn::LoadU(d, p); }

HWY_INLINE V load(D d, const bf16* p) {
  const DU du;
  const D16 d16;
  const VU u = hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p)));
  return hn::BitCast(d, hn::ShiftLeft<16>(u));
}

// Exact fp16 -> fp32 (F. Giesen's half_to_float): normals re-biased, Inf/NaN re-biased twice,
// subnormals normalized by one float subtraction (exact).
HWY_INLINE V load_fp16_integer(D d, hn::Vec<D16> h16) {
  const DU du;
  const VU h = hn::PromoteTo(du, h16);
  const VU o = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
  const VU exp = hn::And(o, hn::Set(du, 0x0f800000u));
  const VU rebias = hn::Set(du, 0x38000000u);  // (127 - 15) << 23
  const VU normal = hn::Add(o, rebias);
  const VU inf_nan = hn::Add(normal, rebias);
  const V sub_f = hn::Sub(hn::BitCast(d, hn::Add(normal, hn::Set(du, 0x00800000u))),
                          hn::BitCast(d, hn::Set(du, 0x38800000u)));  // - 2^-14
  VU r = hn::IfThenElse(hn::Eq(exp, hn::Set(du, 0x0f800000u)), inf_nan, normal);
  r = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), hn::BitCast(du, sub_f), r);
  r = hn::Or(r, hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u))));
  return hn::BitCast(d, r);
}

HWY_INLINE V load(D d, const fp16* p) {
  const D16 d16;
  const hn::Vec<D16> h16 = hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p));
#if TZ_CPU_F16C
  // VCVTPH2PS is exact, but it quiets signalling NaNs where core/dtype.h keeps the payload as it
  // is; the rare vector holding a NaN takes the integer path.
#if HWY_MAX_BYTES == 64
  const V r{_mm512_cvtph_ps(h16.raw)};
#else
  const V r{_mm256_cvtph_ps(h16.raw)};
#endif
  if (HWY_LIKELY(hn::AllFalse(d, hn::IsNaN(r)))) return r;
#endif
  return load_fp16_integer(d, h16);
}

HWY_INLINE void store_bits16(VU bits, std::uint16_t* p) {
  // Every lane holds a value <= 0xffff, so the saturating i32 -> u16 demotion is a plain pack.
  const DI di;
  const D16 d16;
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, p);
}

HWY_INLINE void store(D /*d*/, V v, float* p) { hn::StoreU(v, D(), p); }

// The bf16 value of v (round to nearest even, NaNs quieted) in the upper 16 bits of each 32-bit
// lane; the lower 16 bits are left over from the rounding. No lane overflows: the largest
// non-NaN input, -Inf, is 0xff800000.
HWY_INLINE VU to_bf16_upper(V v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  const VU lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const VU rounded = hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb));
  const VU quiet_nan = hn::Or(u, hn::Set(du, 0x00400000u));
  // IsNaN (one unordered compare) is exactly |bits| > 0x7f800000, a mask and a compare less.
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
}

HWY_INLINE VU to_bf16_bits(V v) { return hn::ShiftRight<16>(to_bf16_upper(v)); }

HWY_INLINE void store(D /*d*/, V v, bf16* p) {
  store_bits16(to_bf16_bits(v), reinterpret_cast<std::uint16_t*>(p));
}

// fp32 -> fp16, round to nearest even (F. Giesen's float_to_half_fast3_rtne): normals round the
// 13 dropped bits with integer math; subnormals let one float addition of 0.5 do the rounding.
HWY_INLINE VU to_fp16_bits(V v) {
  const D d;
  const DU du;
  const DI di;
  const VU u = hn::BitCast(du, v);
  const VU sign = hn::And(u, hn::Set(du, 0x80000000u));
  const VU a = hn::Xor(u, sign);
  const auto ai = hn::BitCast(di, a);
  const VU odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const VU normal = hn::ShiftRight<13>(
      hn::Add(hn::Sub(a, hn::Set(du, 0x38000000u)), hn::Add(hn::Set(du, 0x0fffu), odd)));
  const VU sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(d, a), hn::Set(d, 0.5f))),
                         hn::Set(du, 0x3f000000u));
  VU r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477fefff))),
                     hn::Set(du, 0x7c00u), r);
  const VU nan = hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3ffu)));
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7f800000))), nan, r);
  return hn::Or(r, hn::ShiftRight<16>(sign));
}

// The 16-bit fp16 vector of v: VCVTPS2PH with round-to-nearest-even given in the instruction
// (MXCSR is not consulted) equals core/dtype.h's f32_to_fp16 on every input, NaNs included (both
// keep the sign and top payload bits and set the quiet bit); elsewhere the integer version.
HWY_INLINE hn::Vec<D16> fp16_vector(V v) {
#if TZ_CPU_F16C
#if HWY_MAX_BYTES == 64
  return hn::Vec<D16>{_mm512_cvtps_ph(v.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#else
  return hn::Vec<D16>{_mm256_cvtps_ph(v.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#endif
#else
  const DI di;
  return hn::DemoteTo(D16(), hn::BitCast(di, to_fp16_bits(v)));
#endif
}

HWY_INLINE void store(D /*d*/, V v, fp16* p) {
  hn::StoreU(fp16_vector(v), D16(), reinterpret_cast<std::uint16_t*>(p));
}

HWY_INLINE void store(D /*d*/, V /*v*/, NoCopy* /*p*/) {}

// Stores two vectors of the same dtype (Adam's m and v). On AVX2 two bf16 vectors share one
// pack and one lane permutation: an arithmetic shift leaves each lane's bf16 bits as an int16
// value, which the signed-saturating pack keeps as they are.
HWY_INLINE void store_pair(D d, V a, V b, float* pa, float* pb) {
  hn::StoreU(a, d, pa);
  hn::StoreU(b, d, pb);
}

HWY_INLINE void store_pair(D d, V a, V b, bf16* pa, bf16* pb) {
#if TZ_CPU_NATIVE_BF16
  // VCVTNE2PS2BF16 rounds to nearest even and quiets NaNs exactly as to_bf16_upper does, in one
  // instruction for both vectors instead of about eighteen, but reads subnormal inputs as zero:
  // a pair holding one (rare: Adam's v of tiny gradients) takes the integer path.
  if (cpu_has_avx512_bf16()) {
    const __mmask16 subnormal = static_cast<__mmask16>(_mm512_fpclass_ps_mask(a.raw, 0x20) |
                                                       _mm512_fpclass_ps_mask(b.raw, 0x20));
    if (HWY_LIKELY(subnormal == 0)) {
      // Lanes 0-15 of the result are b's, lanes 16-31 a's.
      const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(a.raw, b.raw));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb), _mm512_castsi512_si256(ab));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pa), _mm512_extracti64x4_epi64(ab, 1));
      return;
    }
  }
  store(d, a, pa);
  store(d, b, pb);
#elif HWY_TARGET == HWY_AVX2
  const DI di;
  const __m256i ai = hn::ShiftRight<16>(hn::BitCast(di, to_bf16_upper(a))).raw;
  const __m256i bi = hn::ShiftRight<16>(hn::BitCast(di, to_bf16_upper(b))).raw;
  // packs: [a0-3 b0-3 | a4-7 b4-7]; the permutation puts a in the low half and b in the high.
  const __m256i ab = _mm256_permute4x64_epi64(_mm256_packs_epi32(ai, bi), 0xd8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(pa), _mm256_castsi256_si128(ab));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(pb), _mm256_extracti128_si256(ab, 1));
#else
  store(d, a, pa);
  store(d, b, pb);
#endif
}

// The 16-bit parameter copy is written and not read again by the CPU: where the target's 16-bit
// vector is a full register (AVX2, AVX3) and the address is aligned to it, a non-temporal store
// skips the read-for-ownership of the destination line (2 of the 30 bytes per element).
// Narrower targets would round the partial vector up to 16 bytes and write past it, so they use
// ordinary stores. The tile driver fences (sfence) after each tile that streamed.
template <class T>
HWY_INLINE void store_copy(D d, V v, T* p) {
  if constexpr (std::is_same_v<T, NoCopy>) {
    return;
  } else {
#if HWY_MAX_BYTES >= 32 && !defined(TZ_CPU_NO_STREAM_COPY)
    const D16 d16;
    const DI di;
    if ((reinterpret_cast<std::uintptr_t>(p) % (hn::Lanes(d16) * sizeof(T))) == 0) {
#if TZ_CPU_NATIVE_BF16
      // VCVTNEPS2BF16, as in store_pair: subnormal lanes take the integer path.
      if constexpr (std::is_same_v<T, bf16>) {
        if (cpu_has_avx512_bf16() && HWY_LIKELY(_mm512_fpclass_ps_mask(v.raw, 0x20) == 0)) {
          const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v.raw));
          _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bits);
          return;
        }
      }
#endif
      const hn::Vec<D16> bits = std::is_same_v<T, fp16>
                                    ? fp16_vector(v)
                                    : hn::DemoteTo(d16, hn::BitCast(di, to_bf16_bits(v)));
      hn::Stream(bits, d16, reinterpret_cast<std::uint16_t*>(p));
      return;
    }
#endif
    store(d, v, p);
  }
}

// ---- the tile driver ----

// Calls body(i, param, grad, state0, state1, copy) for every full vector at element offset i,
// then once more at offset 0 on zero-padded stack copies of the tail (written back after).
// Absent states and copies are null pointers; the body must not touch them.
template <class G, class S, class C, class Body>
HWY_INLINE void for_each_vector(const Tile& t, const Body& body) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  float* p = t.param;
  const G* g = static_cast<const G*>(t.grad);
  S* s0 = static_cast<S*>(t.state[0]);
  S* s1 = static_cast<S*>(t.state[1]);
  C* c = static_cast<C*>(t.copy);
  std::size_t i = 0;
  for (; i + lanes <= t.n; i += lanes) body(i, p, g, s0, s1, c);
  if constexpr (!std::is_same_v<C, NoCopy>) {
    if (c != nullptr) hwy::FlushStream();  // order the copy's non-temporal stores
  }
  if (i == t.n) return;

  constexpr std::size_t kMax = HWY_MAX_BYTES / sizeof(float);
  const std::size_t r = t.n - i;
  HWY_ALIGN float pb[kMax] = {};
  G gb[kMax] = {};
  S s0b[kMax] = {};
  S s1b[kMax] = {};
  C cb[kMax] = {};
  std::memcpy(pb, p + i, r * sizeof(float));
  std::memcpy(gb, g + i, r * sizeof(G));
  if (s0 != nullptr) std::memcpy(s0b, s0 + i, r * sizeof(S));
  if (s1 != nullptr) std::memcpy(s1b, s1 + i, r * sizeof(S));
  body(0, pb, gb, s0 != nullptr ? s0b : nullptr, s1 != nullptr ? s1b : nullptr,
       c != nullptr ? cb : nullptr);
  std::memcpy(p + i, pb, r * sizeof(float));
  if (s0 != nullptr) std::memcpy(s0 + i, s0b, r * sizeof(S));
  if (s1 != nullptr) std::memcpy(s1 + i, s1b, r * sizeof(S));
  if constexpr (!std::is_same_v<C, NoCopy>) {
    if (c != nullptr) std::memcpy(c + i, cb, r * sizeof(C));
  }
}

// ---- the optimizers (operation order as in optimizer_math.h) ----

// RN(x / c) for a divisor c fixed for the whole update, with c_inv = RN(1 / c), without the
// divider: one multiplication and two fused multiply-adds, q0 = RN(x c_inv), r = RN(x - q0 c),
// q = RN(q0 + r c_inv). That this rounds correctly for x and x / c normal is the known result
// Brisebarre, Muller and Raina start from ("Accelerating correctly rounded floating-point division
// when the divisor is known in advance", IEEE TC 53(8), 2004: "one multiplication plus two
// fused-macs"). Adam's x = sqrt(v) is normal, 0, Inf or NaN (the smallest subnormal v has a
// normal root) and c is in (0, 1]. At 0 the sequence gives +0 as the division does (v is never
// -0); at Inf and NaN it gives NaN, and those lanes keep q0 (Inf, or the NaN itself), again as
// the division does. Checked against the division for every mantissa at three exponents and
// Adam's c for six beta2 over thousands of steps (3.5e9 quotients, none different), and by the
// SIMD-vs-reference tests. Why: a 512-bit division takes two passes through Intel's 256-bit
// divider, and with three of them per element the 16-bit-gradient, bf16-state updates were bound
// by it (AVX3 on an Intel AMX Xeon: 2.18 Gparams/s on 2 threads, 0.82-0.85 of the streaming
// ceiling; 2.29 with this).
HWY_INLINE V div_by_constant(V x, V c, V c_inv) {
  const V q0 = hn::Mul(x, c_inv);
  const V q = hn::MulAdd(hn::NegMulAdd(q0, c, x), c_inv, q0);
  return hn::IfThenElse(hn::IsNaN(q), q0, q);
}

// kL2 and kScale (Adam's L2 decay, AdamW's parameter scale) are template arguments so that the
// vector loop carries neither test nor their constants (16 vector registers on AVX2).
template <class G, class S, class C, bool kL2, bool kScale, bool kExactRecip>
HWY_NOINLINE void adam_tile(const optim::AdamCoeffs& k, const Tile* tiles, std::size_t count) {
  const D d;
  const V sbc2_inv = hn::Set(d, 1.0f / k.sqrt_bias_correction2);
  const V scale = hn::Set(d, k.grad_scale);
  const V b1 = hn::Set(d, k.beta1), omb1 = hn::Set(d, k.one_minus_beta1);
  const V b2 = hn::Set(d, k.beta2), omb2 = hn::Set(d, k.one_minus_beta2);
  const V eps = hn::Set(d, k.eps), step = hn::Set(d, k.step_size);
  const V sbc2 = hn::Set(d, k.sqrt_bias_correction2);
  const V l2 = hn::Set(d, k.l2_decay), pscale = hn::Set(d, k.param_scale);
  for (std::size_t ti = 0; ti < count; ++ti) {
    const Tile& t = tiles[ti];
    for_each_vector<G, S, C>(t, [&](std::size_t i, float* P, const G* Gr, S* M, S* Vs, C* Cp)
                                     TZ_TILE_BODY {
      V g = hn::Mul(load(d, Gr + i), scale);
      V p = hn::LoadU(d, P + i);
      if constexpr (kL2) g = hn::Add(g, hn::Mul(l2, p));
      V m = load(d, M + i);
      V v = load(d, Vs + i);
      m = hn::Add(hn::Mul(b1, m), hn::Mul(omb1, g));
      v = hn::Add(hn::Mul(b2, v), hn::Mul(omb2, hn::Mul(g, g)));
      const V root = hn::Sqrt(v);
      const V denom = hn::Add(
          kExactRecip ? div_by_constant(root, sbc2, sbc2_inv) : hn::Div(root, sbc2), eps);
      if constexpr (kScale) p = hn::Mul(p, pscale);
      p = hn::Sub(p, hn::Mul(step, hn::Div(m, denom)));
      hn::StoreU(p, d, P + i);
      store_pair(d, m, v, M + i, Vs + i);
      if constexpr (!std::is_same_v<C, NoCopy>) store_copy(d, p, Cp + i);
    });
  }
}

template <class G, class S, class C, bool kExactRecip>
HWY_INLINE void adam_run_recip(const optim::AdamCoeffs& k, const Tile* tiles, std::size_t count) {
  const bool l2 = k.l2_decay != 0.0f;
  const bool scale = k.param_scale != 1.0f;
  if (l2) {
    scale ? adam_tile<G, S, C, true, true, kExactRecip>(k, tiles, count)
          : adam_tile<G, S, C, true, false, kExactRecip>(k, tiles, count);
  } else {
    scale ? adam_tile<G, S, C, false, true, kExactRecip>(k, tiles, count)
          : adam_tile<G, S, C, false, false, kExactRecip>(k, tiles, count);
  }
}

template <class G, class S, class C>
HWY_INLINE void adam_run(const optim::AdamCoeffs& k, const Tile* tiles, std::size_t count) {
  // div_by_constant needs the divisor and its reciprocal normal; Adam's sqrt bias correction is
  // in (0, 1], so only a degenerate beta2 falls back to the division.
  // The corrections are exact only through a fused multiply-add (HWY_NATIVE_FMA: AVX2, AVX3).
  const float c = k.sqrt_bias_correction2;
  if (HWY_NATIVE_FMA && std::isnormal(c) && std::isnormal(1.0f / c)) {
    adam_run_recip<G, S, C, true>(k, tiles, count);
  } else {
    adam_run_recip<G, S, C, false>(k, tiles, count);
  }
}

template <class G, class C>
HWY_NOINLINE void sgd_tile(const optim::SgdCoeffs& k, const Tile* tiles, std::size_t count) {
  const D d;
  const V scale = hn::Set(d, k.grad_scale), lr = hn::Set(d, k.lr);
  const V mom = hn::Set(d, k.momentum), damp_c = hn::Set(d, k.dampening_complement);
  const V wd = hn::Set(d, k.weight_decay);
  const bool has_wd = k.weight_decay != 0.0f;
  const bool has_momentum = k.momentum != 0.0f;
  for (std::size_t ti = 0; ti < count; ++ti) {
    const Tile& t = tiles[ti];
    for_each_vector<G, float, C>(t, [&](std::size_t i, float* P, const G* Gr, float* B, float*,
                                        C* Cp) TZ_TILE_BODY {
      V g = hn::Mul(load(d, Gr + i), scale);
      V p = hn::LoadU(d, P + i);
      if (has_wd) g = hn::Add(g, hn::Mul(wd, p));
      if (has_momentum) {
        const V buf =
            k.first_step ? g : hn::Add(hn::Mul(mom, hn::LoadU(d, B + i)), hn::Mul(damp_c, g));
        hn::StoreU(buf, d, B + i);
        g = k.nesterov ? hn::Add(g, hn::Mul(mom, buf)) : buf;
      }
      p = hn::Sub(p, hn::Mul(lr, g));
      hn::StoreU(p, d, P + i);
      if constexpr (!std::is_same_v<C, NoCopy>) store_copy(d, p, Cp + i);
    });
  }
}

template <class G, class C>
HWY_NOINLINE void lion_tile(const optim::LionCoeffs& k, const Tile* tiles, std::size_t count) {
  const D d;
  const V scale = hn::Set(d, k.grad_scale), lr = hn::Set(d, k.lr);
  const V b1 = hn::Set(d, k.beta1), omb1 = hn::Set(d, k.one_minus_beta1);
  const V b2 = hn::Set(d, k.beta2), omb2 = hn::Set(d, k.one_minus_beta2);
  const V pscale = hn::Set(d, k.param_scale);
  const V zero = hn::Zero(d), one = hn::Set(d, 1.0f), minus_one = hn::Set(d, -1.0f);
  const bool has_scale = k.param_scale != 1.0f;
  for (std::size_t ti = 0; ti < count; ++ti) {
    const Tile& t = tiles[ti];
    for_each_vector<G, float, C>(t, [&](std::size_t i, float* P, const G* Gr, float* M, float*,
                                        C* Cp) TZ_TILE_BODY {
      const V g = hn::Mul(load(d, Gr + i), scale);
      V p = hn::LoadU(d, P + i);
      const V m = hn::LoadU(d, M + i);
      const V x = hn::Add(hn::Mul(b1, m), hn::Mul(omb1, g));
      const V u = hn::IfThenElse(hn::Gt(x, zero), one,
                                 hn::IfThenElse(hn::Lt(x, zero), minus_one, zero));
      if (has_scale) p = hn::Mul(p, pscale);
      p = hn::Sub(p, hn::Mul(lr, u));
      hn::StoreU(p, d, P + i);
      hn::StoreU(hn::Add(hn::Mul(b2, m), hn::Mul(omb2, g)), d, M + i);
      if constexpr (!std::is_same_v<C, NoCopy>) store_copy(d, p, Cp + i);
    });
  }
}

template <class G, class C>
HWY_NOINLINE void adagrad_tile(const optim::AdagradCoeffs& k, const Tile* tiles, std::size_t count) {
  const D d;
  const V scale = hn::Set(d, k.grad_scale), clr = hn::Set(d, k.clr);
  const V eps = hn::Set(d, k.eps), wd = hn::Set(d, k.weight_decay);
  const bool has_wd = k.weight_decay != 0.0f;
  for (std::size_t ti = 0; ti < count; ++ti) {
    const Tile& t = tiles[ti];
    for_each_vector<G, float, C>(t, [&](std::size_t i, float* P, const G* Gr, float* Sum, float*,
                                        C* Cp) TZ_TILE_BODY {
      V g = hn::Mul(load(d, Gr + i), scale);
      V p = hn::LoadU(d, P + i);
      if (has_wd) g = hn::Add(g, hn::Mul(wd, p));
      const V sum = hn::Add(hn::LoadU(d, Sum + i), hn::Mul(g, g));
      hn::StoreU(sum, d, Sum + i);
      p = hn::Sub(p, hn::Mul(clr, hn::Div(g, hn::Add(hn::Sqrt(sum), eps))));
      hn::StoreU(p, d, P + i);
      if constexpr (!std::is_same_v<C, NoCopy>) store_copy(d, p, Cp + i);
    });
  }
}

// Runs `fn(first, count, copy_tag)` for each run of consecutive tiles that agree on whether they
// write a copy, so the dtype dispatch and the coefficient broadcasts happen once per run.
template <class Fn>
HWY_INLINE void for_each_copy_run(const Tile* tiles, std::size_t count, const Fn& fn) {
  std::size_t i = 0;
  while (i < count) {
    const bool has_copy = tiles[i].copy != nullptr;
    std::size_t j = i + 1;
    while (j < count && (tiles[j].copy != nullptr) == has_copy) ++j;
    fn(tiles + i, j - i, tiles[i].copy);
    i = j;
  }
}

void update(const StepKernel& k, const Tile* tiles, std::size_t count) {
  for_each_copy_run(tiles, count, [&](const Tile* run, std::size_t n, const void* copy) {
    with_value_type(k.grad_dtype, [&](auto g) {
      using G = decltype(g);
      with_copy_type(copy, k.copy_dtype, [&](auto c) {
        using C = decltype(c);
        switch (k.kind) {
          case optim::OptimizerKind::kAdam:
            if (k.state_dtype == DType::kBF16) {
              adam_run<G, bf16, C>(k.adam, run, n);
            } else {
              adam_run<G, float, C>(k.adam, run, n);
            }
            return;
          case optim::OptimizerKind::kSgd: sgd_tile<G, C>(k.sgd, run, n); return;
          case optim::OptimizerKind::kLion: lion_tile<G, C>(k.lion, run, n); return;
          case optim::OptimizerKind::kAdagrad: adagrad_tile<G, C>(k.adagrad, run, n); return;
        }
      });
    });
  });
}

// ---- the bandwidth ceiling: same loads and stores, trivial math ----

template <class G, class S, class C>
HWY_NOINLINE void stream_tile(const Tile* tiles, std::size_t count) {
  const D d;
  for (std::size_t ti = 0; ti < count; ++ti) {
    const Tile& t = tiles[ti];
    for_each_vector<G, S, C>(t, [&](std::size_t i, float* P, const G* Gr, S* S0, S* S1, C* Cp)
                                     TZ_TILE_BODY {
      const V g = load(d, Gr + i);
      const V p = hn::Add(hn::LoadU(d, P + i), g);
      hn::StoreU(p, d, P + i);
      if (S0 != nullptr) store(d, hn::Add(load(d, S0 + i), g), S0 + i);
      if (S1 != nullptr) store(d, hn::Add(load(d, S1 + i), g), S1 + i);
      if constexpr (!std::is_same_v<C, NoCopy>) store_copy(d, p, Cp + i);
    });
  }
}

void stream(const StreamKernel& k, const Tile* tiles, std::size_t count) {
  for_each_copy_run(tiles, count, [&](const Tile* run, std::size_t n, const void* copy) {
    with_value_type(k.grad_dtype, [&](auto g) {
      with_copy_type(copy, k.copy_dtype, [&](auto c) {
        if (k.state_dtype == DType::kBF16) {
          stream_tile<decltype(g), bf16, decltype(c)>(run, n);
        } else {
          stream_tile<decltype(g), float, decltype(c)>(run, n);
        }
      });
    });
  });
}

// ---- conversions ----

template <class T>
HWY_NOINLINE void f32_to_16_typed(const float* in, T* out, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) store(d, hn::LoadU(d, in + i), out + i);
  if (i == n) return;
  constexpr std::size_t kMax = HWY_MAX_BYTES / sizeof(float);
  HWY_ALIGN float ib[kMax] = {};
  T ob[kMax] = {};
  std::memcpy(ib, in + i, (n - i) * sizeof(float));
  store(d, hn::Load(d, ib), ob);
  std::memcpy(out + i, ob, (n - i) * sizeof(T));
}

void f32_to_16(const float* in, void* out, DType out_dtype, std::size_t n) {
  if (out_dtype == DType::kF16) {
    f32_to_16_typed(in, static_cast<fp16*>(out), n);
  } else {
    f32_to_16_typed(in, static_cast<bf16*>(out), n);
  }
}

template <class T>
HWY_NOINLINE void from_16_typed(const T* in, float* out, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(load(d, in + i), d, out + i);
  if (i == n) return;
  constexpr std::size_t kMax = HWY_MAX_BYTES / sizeof(float);
  T ib[kMax] = {};
  HWY_ALIGN float ob[kMax] = {};
  std::memcpy(ib, in + i, (n - i) * sizeof(T));
  hn::Store(load(d, ib), d, ob);
  std::memcpy(out + i, ob, (n - i) * sizeof(float));
}

void from_16(const void* in, DType in_dtype, float* out, std::size_t n) {
  if (in_dtype == DType::kF16) {
    from_16_typed(static_cast<const fp16*>(in), out, n);
  } else {
    from_16_typed(static_cast<const bf16*>(in), out, n);
  }
}

const KernelTable& table() {
  static const KernelTable t{hwy::TargetName(HWY_TARGET), &update, &stream, &f32_to_16,
                             &from_16};
  return t;
}

}  // namespace HWY_NAMESPACE
}  // namespace tz::cpu::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <atomic>
#include <string>
#include <vector>

#include "cpu/simd.h"
#include "cpu/span_update.h"

namespace tz::cpu {
namespace detail {
namespace {

struct CompiledTarget {
  std::int64_t bit;
  const KernelTable& (*table)();
};

// Best first (lower Highway target bits are better on x86).
constexpr CompiledTarget kCompiled[] = {
#if HWY_TARGETS & HWY_AVX3
    {HWY_AVX3, &N_AVX3::table},
#endif
#if HWY_TARGETS & HWY_AVX2
    {HWY_AVX2, &N_AVX2::table},
#endif
#if HWY_TARGETS & HWY_SSE4
    {HWY_SSE4, &N_SSE4::table},
#endif
#if HWY_TARGETS & HWY_EMU128
    {HWY_EMU128, &N_EMU128::table},
#endif
#if HWY_TARGETS & HWY_SCALAR
    {HWY_SCALAR, &N_SCALAR::table},
#endif
};

std::atomic<const KernelTable*>& forced_table() {
  static std::atomic<const KernelTable*> forced{nullptr};
  return forced;
}

}  // namespace

std::vector<const KernelTable*> supported_simd_kernels() {
  const std::int64_t supported = hwy::SupportedTargets();
  std::vector<const KernelTable*> out;
  for (const CompiledTarget& c : kCompiled) {
    if ((supported & c.bit) != 0) out.push_back(&c.table());
  }
  return out;
}

const KernelTable& active_kernels() {
  if (const KernelTable* forced = forced_table().load(std::memory_order_acquire)) return *forced;
  static const KernelTable* best = [] {
    const std::vector<const KernelTable*> tables = supported_simd_kernels();
    return tables.empty() ? &reference_kernels() : tables.front();
  }();
  return *best;
}

}  // namespace detail

std::vector<std::string> simd_targets_supported() {
  std::vector<std::string> out;
  const std::int64_t supported = hwy::SupportedTargets();
  for (int bit = 0; bit < 64; ++bit) {
    const std::int64_t target = std::int64_t{1} << bit;
    if ((supported & target) != 0) out.emplace_back(hwy::TargetName(target));
  }
  return out;
}

std::vector<std::string> simd_targets_compiled() {
  std::vector<std::string> out;
  for (const detail::CompiledTarget& c : detail::kCompiled) out.emplace_back(c.table().name);
  out.emplace_back(detail::reference_kernels().name);
  return out;
}

std::string simd_dispatch_target() { return detail::active_kernels().name; }

void update_span(const SpanUpdate& u) {
  if (u.n == 0) return;
  detail::StepKernel k;
  k.kind = u.kind;
  k.grad_dtype = u.grad_dtype;
  k.state_dtype = DType::kF32;
  k.copy_dtype = u.copy_dtype;
  k.adam = u.adam;
  k.sgd = u.sgd;
  k.lion = u.lion;
  k.adagrad = u.adagrad;
  detail::Tile t;
  t.param = u.param;
  t.grad = u.grad;
  t.state[0] = u.state[0];
  t.state[1] = u.state[1];
  t.copy = u.param_copy;
  t.n = u.n;
  detail::active_kernels().update(k, &t, 1);
}

Status set_simd_target(std::string_view name) {
  if (name.empty() || name == "auto") {
    detail::forced_table().store(nullptr, std::memory_order_release);
    return Status::ok();
  }
  if (name == detail::reference_kernels().name) {
    detail::forced_table().store(&detail::reference_kernels(), std::memory_order_release);
    return Status::ok();
  }
  std::string accepted = "auto, reference";
  for (const detail::KernelTable* t : detail::supported_simd_kernels()) {
    if (name == t->name) {
      detail::forced_table().store(t, std::memory_order_release);
      return Status::ok();
    }
    accepted += std::string(", ") + t->name;
  }
  return Status::invalid_argument("SIMD target '" + std::string(name) +
                                  "' is not compiled in or not supported by this CPU; accepted: " +
                                  accepted);
}

void convert_f32_to_16(const float* in, void* out, DType out_dtype, std::size_t n) {
  TZ_ASSERT(out_dtype != DType::kF32, "convert_f32_to_16 needs a 16-bit output type");
  detail::active_kernels().f32_to_16(in, out, out_dtype, n);
}

void convert_16_to_f32(const void* in, DType in_dtype, float* out, std::size_t n) {
  TZ_ASSERT(in_dtype != DType::kF32, "convert_16_to_f32 needs a 16-bit input type");
  detail::active_kernels().from_16(in, in_dtype, out, n);
}

}  // namespace tz::cpu

#endif  // HWY_ONCE
