// CUDA kernels of the ops CUDA backend (internal/cuda_kernels.h) for everything but the matmuls
// (cuBLAS, cuda_ops.cc). The per-element math is ops/ops_math.h, shared with the CPU backend. No
// kernel uses atomics: every sum runs in a fixed order, so results are deterministic.
// Attention is the blocked online-softmax form: K/V tiles in shared memory, one thread per query
// (forward, dQ) or per key (dK, dV), never a T x T matrix. Built for sm_80 and sm_90.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "ops/internal/cuda_kernels.h"
#include "ops/ops_math.h"

namespace tz::ops::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;
constexpr int kAttnRows = 64;  // query (or key) rows per attention thread block, one per thread
constexpr int kAttnTile = 32;  // rows of the other side per shared-memory tile

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
unsigned grid_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < static_cast<std::int64_t>(kMaxBlocks) ? (b > 0 ? b : 1)
                                                                         : kMaxBlocks);
}
int last_error() { return static_cast<int>(cudaGetLastError()); }

template <typename T>
__device__ float ld(const T* p, std::int64_t i) {
  return to_f32(p[i]);
}
template <typename T>
__device__ void st(T* p, std::int64_t i, float v) {
  p[i] = from_f32<T>(v);
}

#define TZ_GRID_STRIDE(i, n)                                                          \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum (or max) over the block of kThreads threads; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) shared[warp] = v;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < kThreads / 32; ++w) r = kMax ? fmaxf(r, shared[w]) : r + shared[w];
  __syncthreads();
  return r;
}

// ---- embedding ----

template <typename T>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* tok, const T* wte,
                                         const T* wpe, std::int64_t rows, std::int64_t seq,
                                         std::int64_t c, std::int64_t first_row,
                                         std::int64_t table_rows) {
  TZ_GRID_STRIDE(i, rows * c) {
    const std::int64_t r = i / c;
    const std::int64_t k = i % c;
    const std::int64_t row = tok[r] - first_row;
    if (row < 0 || row >= table_rows) continue;  // another slice's token
    const float w = ld(wte, row * c + k);
    st(out, i, wpe != nullptr ? w + ld(wpe, (r % seq) * c + k) : w);  // null: no positions
  }
}

// Thread (r, k): when row r is its token's first occurrence, sums every row of that token in row
// order (fp32) and adds the sum into the table once.
template <typename T>
__global__ void embedding_wte_kernel(T* dwte, const T* dout, const std::int32_t* tok,
                                     std::int64_t rows, std::int64_t c, std::int64_t first_row,
                                     std::int64_t table_rows) {
  const std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (k >= c) return;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int32_t t = tok[r];
    if (t < first_row || t >= first_row + table_rows) continue;  // another slice's token
    bool first = true;
    for (std::int64_t r2 = 0; r2 < r && first; ++r2) first = tok[r2] != t;
    if (!first) continue;
    float s = 0;
    for (std::int64_t r2 = r; r2 < rows; ++r2) {
      if (tok[r2] == t) s += ld(dout, r2 * c + k);
    }
    const std::int64_t row = t - first_row;
    st(dwte, row * c + k, ld(dwte, row * c + k) + s);
  }
}

template <typename T>
__global__ void embedding_wpe_kernel(T* dwpe, const T* dout, std::int64_t batch, std::int64_t seq,
                                     std::int64_t c) {
  TZ_GRID_STRIDE(i, seq * c) {
    const std::int64_t t = i / c;
    const std::int64_t k = i % c;
    float s = 0;
    for (std::int64_t b = 0; b < batch; ++b) s += ld(dout, (b * seq + t) * c + k);
    st(dwpe, i, ld(dwpe, i) + s);
  }
}

// ---- strided block copy ----

template <typename T>
__global__ void copy_block_kernel(T* dst, std::int64_t dst_stride, const T* src,
                                  std::int64_t src_stride, std::int64_t rows, std::int64_t cols) {
  TZ_GRID_STRIDE(i, rows * cols) {
    const std::int64_t r = i / cols;
    const std::int64_t k = i % cols;
    dst[r * dst_stride + k] = src[r * src_stride + k];
  }
}

// ---- layernorm: one warp per row ----

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* w,
                                         const T* b, std::int64_t rows, int dim) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * dim;
  float s = 0;
  for (int k = lane; k < dim; k += 32) s += ld(xr, k);
  const float m = math::layernorm_mean(warp_sum(s), dim);
  float sq = 0;
  for (int k = lane; k < dim; k += 32) {
    const float d = ld(xr, k) - m;
    sq += d * d;
  }
  const float rs = math::layernorm_rstd(warp_sum(sq), dim);
  for (int k = lane; k < dim; k += 32) {
    st(out, row * dim + k, (ld(xr, k) - m) * rs * ld(w, k) + ld(b, k));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

template <typename T>
__global__ void layernorm_dx_kernel(T* dx, bool add, const T* dout, const T* x, const T* w,
                                    const float* mean, const float* rstd, std::int64_t rows,
                                    int dim) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float m = mean[row];
  const float rs = rstd[row];
  float s1 = 0;
  float s2 = 0;
  for (int k = lane; k < dim; k += 32) {
    const float dxhat = ld(dout, row * dim + k) * ld(w, k);
    s1 += dxhat;
    s2 += dxhat * (ld(x, row * dim + k) - m) * rs;
  }
  const float m1 = warp_sum(s1) / static_cast<float>(dim);
  const float m2 = warp_sum(s2) / static_cast<float>(dim);
  for (int k = lane; k < dim; k += 32) {
    const std::int64_t i = row * dim + k;
    const float g = math::layernorm_dx(ld(dout, i) * ld(w, k), (ld(x, i) - m) * rs, m1, m2, rs);
    st(dx, i, add ? ld(dx, i) + g : g);
  }
}

// One thread per column: dweight += sum_r dout * xhat, dbias += sum_r dout, in row order.
template <typename T>
__global__ void layernorm_params_kernel(T* dw, T* db, const T* dout, const T* x,
                                        const float* mean, const float* rstd, std::int64_t rows,
                                        int dim) {
  TZ_GRID_STRIDE(k, dim) {
    float sw = 0;
    float sb = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float g = ld(dout, r * dim + k);
      sw += g * (ld(x, r * dim + k) - mean[r]) * rstd[r];
      sb += g;
    }
    if (dw != nullptr) st(dw, k, ld(dw, k) + sw);
    if (db != nullptr) st(db, k, ld(db, k) + sb);
  }
}

// ---- matmul helpers ----

template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* bias, std::int64_t rows, std::int64_t cols) {
  TZ_GRID_STRIDE(i, rows * cols) { out[i] = bias[i % cols]; }
}

template <typename T>
__global__ void column_sums_kernel(T* dbias, const T* dout, std::int64_t rows, std::int64_t cols) {
  TZ_GRID_STRIDE(k, cols) {
    float s = 0;
    for (std::int64_t r = 0; r < rows; ++r) s += ld(dout, r * cols + k);
    st(dbias, k, ld(dbias, k) + s);
  }
}

// ---- grouped-query attention (q, k, v each with its own row stride) ----

struct GqaShape {
  std::int64_t tq;      // queries per batch
  std::int64_t tk;      // keys per batch
  std::int64_t off;     // absolute position of query 0 (tk - tq)
  std::int64_t q_stride;
  std::int64_t kv_stride;
  int q_heads;
  int group;            // q_heads / kv_heads
  int hd;
  float scale;
  __device__ std::int64_t q(std::int64_t b, std::int64_t t, int h) const {
    return (b * tq + t) * q_stride + static_cast<std::int64_t>(h) * hd;
  }
  __device__ std::int64_t kv(std::int64_t b, std::int64_t j, int h) const {
    return (b * tk + j) * kv_stride + static_cast<std::int64_t>(h / group) * hd;
  }
  __device__ std::int64_t out(std::int64_t b, std::int64_t t, int h) const {
    return (b * tq + t) * q_heads * static_cast<std::int64_t>(hd) +
           static_cast<std::int64_t>(h) * hd;
  }
};

// Rows [r0, r0 + kAttnTile) of query head h's kv head from `src` into tile (kAttnTile x HD).
template <typename T, int HD>
__device__ void load_kv_tile(float (*tile)[HD], const T* src, const GqaShape& s, std::int64_t b,
                             int h, std::int64_t r0) {
  for (int idx = threadIdx.x; idx < kAttnTile * HD; idx += blockDim.x) {
    const int j = idx / HD;
    const int d = idx % HD;
    tile[j][d] = (r0 + j < s.tk && d < s.hd) ? ld(src, s.kv(b, r0 + j, h) + d) : 0.0f;
  }
}

// grid (query blocks, batch*q_heads), kAttnRows threads; thread = one query row, at absolute
// position off + t, seeing keys 0 .. off + t.
template <typename T, int HD>
__global__ void gqa_forward_kernel(T* out, float* lse, const T* qp, const T* kp, const T* vp,
                                   GqaShape s) {
  __shared__ float ks[kAttnTile][HD];
  __shared__ float vs[kAttnTile][HD];
  const std::int64_t bh = blockIdx.y;
  const std::int64_t b = bh / s.q_heads;
  const int h = static_cast<int>(bh % s.q_heads);
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * kAttnRows;
  const std::int64_t t = q0 + threadIdx.x;
  const bool active = t < s.tq;
  float q[HD];
  float acc[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    q[d] = active && d < s.hd ? ld(qp, s.q(b, t, h) + d) * s.scale : 0.0f;
    acc[d] = 0.0f;
  }
  math::OnlineSoftmax norm;
  const std::int64_t last_q = q0 + kAttnRows - 1 < s.tq ? q0 + kAttnRows - 1 : s.tq - 1;
  const std::int64_t last = s.off + last_q;  // the block's last key
  const std::int64_t pos = s.off + t;
  for (std::int64_t k0 = 0; k0 <= last; k0 += kAttnTile) {
    load_kv_tile<T, HD>(ks, kp, s, b, h, k0);
    load_kv_tile<T, HD>(vs, vp, s, b, h, k0);
    __syncthreads();
    if (active) {
      for (int j = 0; j < kAttnTile && k0 + j <= pos; ++j) {
        float sc = 0;
#pragma unroll
        for (int d = 0; d < HD; ++d) sc += q[d] * ks[j][d];
        const float new_max = fmaxf(norm.max, sc);
        const float corr = norm.rescale(new_max);
        const float p = expf(sc - new_max);
        norm.sum = norm.sum * corr + p;
        norm.max = new_max;
#pragma unroll
        for (int d = 0; d < HD; ++d) acc[d] = acc[d] * corr + p * vs[j][d];
      }
    }
    __syncthreads();
  }
  if (!active) return;
  const float inv = 1.0f / norm.sum;
  for (int d = 0; d < s.hd; ++d) st(out, s.out(b, t, h) + d, acc[d] * inv);
  lse[bh * s.tq + t] = norm.log_sum_exp();
}

template <typename T>
__global__ void gqa_delta_kernel(float* delta, const T* dout, const T* out, std::int64_t bhs,
                                 GqaShape s) {
  TZ_GRID_STRIDE(i, bhs) {
    const std::int64_t t = i % s.tq;
    const std::int64_t bh = i / s.tq;
    const std::int64_t b = bh / s.q_heads;
    const int h = static_cast<int>(bh % s.q_heads);
    float acc = 0;
    for (int d = 0; d < s.hd; ++d) acc += ld(dout, s.out(b, t, h) + d) * ld(out, s.out(b, t, h) + d);
    delta[i] = acc;
  }
}

// dQ (training: tq == tk): thread = one query row, over key tiles up to it.
template <typename T, int HD>
__global__ void gqa_dq_kernel(T* dqp, bool add, const T* dout, const T* qp, const T* kp,
                              const T* vp, const float* lse, const float* delta, GqaShape s) {
  __shared__ float ks[kAttnTile][HD];
  __shared__ float vs[kAttnTile][HD];
  const std::int64_t bh = blockIdx.y;
  const std::int64_t b = bh / s.q_heads;
  const int h = static_cast<int>(bh % s.q_heads);
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * kAttnRows;
  const std::int64_t t = q0 + threadIdx.x;
  const bool active = t < s.tq;
  float q[HD];
  float g[HD];
  float dq[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    q[d] = active && d < s.hd ? ld(qp, s.q(b, t, h) + d) : 0.0f;
    g[d] = active && d < s.hd ? ld(dout, s.out(b, t, h) + d) : 0.0f;
    dq[d] = 0.0f;
  }
  const float l = active ? lse[bh * s.tq + t] : 0.0f;
  const float di = active ? delta[bh * s.tq + t] : 0.0f;
  const std::int64_t last = q0 + kAttnRows - 1 < s.tq ? q0 + kAttnRows - 1 : s.tq - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += kAttnTile) {
    load_kv_tile<T, HD>(ks, kp, s, b, h, k0);
    load_kv_tile<T, HD>(vs, vp, s, b, h, k0);
    __syncthreads();
    if (active) {
      for (int j = 0; j < kAttnTile && k0 + j <= t; ++j) {
        float sc = 0;
        float dp = 0;
#pragma unroll
        for (int d = 0; d < HD; ++d) {
          sc += q[d] * ks[j][d];
          dp += g[d] * vs[j][d];
        }
        const float p = expf(sc * s.scale - l);
        const float ds = p * (dp - di) * s.scale;
#pragma unroll
        for (int d = 0; d < HD; ++d) dq[d] += ds * ks[j][d];
      }
    }
    __syncthreads();
  }
  if (!active) return;
  for (int d = 0; d < s.hd; ++d) {
    const std::int64_t i = s.q(b, t, h) + d;
    st(dqp, i, add ? ld(dqp, i) + dq[d] : dq[d]);
  }
}

// dK, dV (training): grid (key blocks, batch*kv_heads); thread = one key row of one kv head, over
// the query heads of its group in head order and, for each, the query tiles from its own block
// to the end: one fixed order of sums, no atomics.
template <typename T, int HD>
__global__ void gqa_dkv_kernel(T* dkp, T* dvp, bool add, const T* dout, const T* qp, const T* kp,
                               const T* vp, const float* lse, const float* delta, GqaShape s) {
  __shared__ float qs[kAttnTile][HD];
  __shared__ float gs[kAttnTile][HD];
  __shared__ float ls[kAttnTile];
  __shared__ float dls[kAttnTile];
  const int kv_heads = s.q_heads / s.group;
  const std::int64_t bkv = blockIdx.y;
  const std::int64_t b = bkv / kv_heads;
  const int kvh = static_cast<int>(bkv % kv_heads);
  const std::int64_t k0 = static_cast<std::int64_t>(blockIdx.x) * kAttnRows;
  const std::int64_t j = k0 + threadIdx.x;
  const bool active = j < s.tk;
  const int h0 = kvh * s.group;  // the group's first query head (s.kv maps it to kvh)
  float k[HD];
  float v[HD];
  float dk[HD];
  float dv[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    k[d] = active && d < s.hd ? ld(kp, s.kv(b, j, h0) + d) : 0.0f;
    v[d] = active && d < s.hd ? ld(vp, s.kv(b, j, h0) + d) : 0.0f;
    dk[d] = 0.0f;
    dv[d] = 0.0f;
  }
  for (int h = h0; h < h0 + s.group; ++h) {
    const std::int64_t bh = b * s.q_heads + h;
    for (std::int64_t r0 = k0; r0 < s.tq; r0 += kAttnTile) {
      for (int idx = threadIdx.x; idx < kAttnTile * HD; idx += blockDim.x) {
        const int i = idx / HD;
        const int d = idx % HD;
        const bool in = r0 + i < s.tq && d < s.hd;
        qs[i][d] = in ? ld(qp, s.q(b, r0 + i, h) + d) : 0.0f;
        gs[i][d] = in ? ld(dout, s.out(b, r0 + i, h) + d) : 0.0f;
      }
      for (int i = threadIdx.x; i < kAttnTile; i += blockDim.x) {
        ls[i] = r0 + i < s.tq ? lse[bh * s.tq + r0 + i] : 0.0f;
        dls[i] = r0 + i < s.tq ? delta[bh * s.tq + r0 + i] : 0.0f;
      }
      __syncthreads();
      if (active) {
        for (int i = 0; i < kAttnTile && r0 + i < s.tq; ++i) {
          if (r0 + i < j) continue;  // causal: query r0+i sees key j only when j <= r0+i
          float sc = 0;
          float dp = 0;
#pragma unroll
          for (int d = 0; d < HD; ++d) {
            sc += qs[i][d] * k[d];
            dp += gs[i][d] * v[d];
          }
          const float p = expf(sc * s.scale - ls[i]);
          const float dsc = p * (dp - dls[i]) * s.scale;
#pragma unroll
          for (int d = 0; d < HD; ++d) {
            dv[d] += p * gs[i][d];
            dk[d] += dsc * qs[i][d];
          }
        }
      }
      __syncthreads();
    }
  }
  if (!active) return;
  for (int d = 0; d < s.hd; ++d) {
    const std::int64_t i = s.kv(b, j, h0) + d;
    st(dkp, i, add ? ld(dkp, i) + dk[d] : dk[d]);
    st(dvp, i, add ? ld(dvp, i) + dv[d] : dv[d]);
  }
}

// ---- RMSNorm: one warp per row ----

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, float eps,
                                       std::int64_t rows, int dim) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * dim;
  float sq = 0;
  for (int k = lane; k < dim; k += 32) {
    const float v = ld(xr, k);
    sq += v * v;
  }
  const float rs = math::rmsnorm_rstd(warp_sum(sq), dim, eps);
  // Every lane has read its elements of x above; out may alias x (each lane rewrites only its
  // own elements, after the warp's sum).
  for (int k = lane; k < dim; k += 32) st(out, row * dim + k, ld(xr, k) * rs * ld(w, k));
  if (lane == 0) rstd[row] = rs;
}

template <typename T>
__global__ void rmsnorm_dx_kernel(T* dx, bool add, const T* dout, const T* x, const T* w,
                                  const float* rstd, std::int64_t rows, int dim) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float rs = rstd[row];
  float s = 0;
  for (int k = lane; k < dim; k += 32) {
    s += ld(dout, row * dim + k) * ld(w, k) * ld(x, row * dim + k);
  }
  const float m = warp_sum(s) / static_cast<float>(dim);
  for (int k = lane; k < dim; k += 32) {
    const std::int64_t i = row * dim + k;
    const float g = math::rmsnorm_dx(ld(dout, i) * ld(w, k), ld(x, i), rs, m);
    st(dx, i, add ? ld(dx, i) + g : g);
  }
}

// One thread per column: dweight += sum_r dout * x * rstd, in row order.
template <typename T>
__global__ void rmsnorm_dweight_kernel(T* dw, const T* dout, const T* x, const float* rstd,
                                       std::int64_t rows, int dim) {
  TZ_GRID_STRIDE(k, dim) {
    float sw = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      sw += ld(dout, r * dim + k) * (ld(x, r * dim + k) * rstd[r]);
    }
    st(dw, k, ld(dw, k) + sw);
  }
}

// ---- rotary embedding: one thread per rotated pair ----

template <typename T>
__global__ void rope_kernel(T* x, const float* inv_freq, std::int64_t rows, std::int64_t seq,
                            int heads, int half, std::int64_t row_stride, std::int64_t pos_offset,
                            float sign) {
  TZ_GRID_STRIDE(e, rows * heads * half) {
    const int i = static_cast<int>(e % half);
    const std::int64_t rh = e / half;
    const int h = static_cast<int>(rh % heads);
    const std::int64_t r = rh / heads;
    const float a = math::rope_angle(pos_offset + r % seq, inv_freq[i]);
    const std::int64_t base = r * row_stride + static_cast<std::int64_t>(h) * 2 * half;
    float y0, y1;
    math::rope_rotate(ld(x, base + i), ld(x, base + half + i), cosf(a), sign * sinf(a), &y0, &y1);
    st(x, base + i, y0);
    st(x, base + half + i, y1);
  }
}

// ---- SwiGLU ----

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, std::int64_t rows,
                                      std::int64_t dim, std::int64_t stride) {
  TZ_GRID_STRIDE(e, rows * dim) {
    const std::int64_t i = (e / dim) * stride + e % dim;
    st(out, e, math::swiglu_forward(ld(gate, i), ld(up, i)));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate,
                                       const T* up, std::int64_t rows, std::int64_t dim,
                                       std::int64_t stride) {
  TZ_GRID_STRIDE(e, rows * dim) {
    const std::int64_t i = (e / dim) * stride + e % dim;
    float dg, du;
    math::swiglu_backward(ld(gate, i), ld(up, i), ld(dout, e), &dg, &du);
    st(dgate, i, dg);
    st(dup, i, du);
  }
}

// ---- element-wise ----

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* x, std::int64_t n) {
  TZ_GRID_STRIDE(i, n) { st(out, i, math::gelu_forward(ld(x, i))); }
}
template <typename T>
__global__ void gelu_backward_kernel(T* dx, bool add, const T* dout, const T* x, std::int64_t n) {
  TZ_GRID_STRIDE(i, n) {
    const float g = ld(dout, i) * math::gelu_derivative(ld(x, i));
    st(dx, i, add ? ld(dx, i) + g : g);
  }
}
template <typename T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  TZ_GRID_STRIDE(i, n) { st(out, i, ld(a, i) + ld(b, i)); }
}
template <typename T>
__global__ void accumulate_kernel(T* dst, bool add, const T* src, std::int64_t n) {
  TZ_GRID_STRIDE(i, n) { st(dst, i, add ? ld(dst, i) + ld(src, i) : ld(src, i)); }
}

template <typename T>
__global__ void scale_kernel(T* out, bool add, const T* x, const std::uint8_t* keep, float alpha,
                             std::int64_t n) {
  TZ_GRID_STRIDE(i, n) {
    const float v = keep != nullptr && keep[i] == 0 ? 0.0f : alpha * ld(x, i);
    st(out, i, add ? ld(out, i) + v : v);
  }
}

// ---- cross-entropy: one block per row ----

template <typename T>
__global__ void cross_entropy_kernel(T* dlogits, float* losses, const T* logits,
                                     const std::int32_t* targets, std::int64_t rows,
                                     std::int64_t vocab, float grad_scale) {
  __shared__ float shared[kThreads / 32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * vocab;
    float m = -INFINITY;
    for (std::int64_t k = threadIdx.x; k < vocab; k += blockDim.x) m = fmaxf(m, ld(x, k));
    m = block_reduce<true>(m, shared);
    float s = 0;
    for (std::int64_t k = threadIdx.x; k < vocab; k += blockDim.x) s += expf(ld(x, k) - m);
    s = block_reduce<false>(s, shared);
    math::OnlineSoftmax norm;
    norm.merge(m, s);
    const float l = norm.log_sum_exp();
    const std::int32_t tgt = targets[r];
    const float target_logit = ld(x, tgt);
    __syncthreads();  // every thread has read the target's logit before any overwrites it
    if (threadIdx.x == 0 && losses != nullptr) losses[r] = math::cross_entropy_loss(l, target_logit);
    if (dlogits != nullptr) {
      for (std::int64_t k = threadIdx.x; k < vocab; k += blockDim.x) {
        st(dlogits, r * vocab + k, math::cross_entropy_grad(ld(x, k), l, k == tgt, grad_scale));
      }
    }
    __syncthreads();
  }
}

// Runs fn(T{}) for the storage type of dt.
template <typename Fn>
void dispatch(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::kF32: fn(float{}); break;
    case DType::kBF16: fn(bf16{}); break;
    case DType::kF16: fn(fp16{}); break;
  }
}

template <typename Fn>
void dispatch_hd(int hd, Fn&& fn) {
  if (hd <= 32) {
    fn(std::integral_constant<int, 32>{});
  } else if (hd <= 64) {
    fn(std::integral_constant<int, 64>{});
  } else {
    fn(std::integral_constant<int, kMaxHeadDim>{});
  }
}

unsigned warps_grid(std::int64_t rows) {
  return static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
}

}  // namespace

int embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe,
                      std::int64_t batch, std::int64_t seq, std::int64_t embd,
                      std::int64_t first_row, std::int64_t table_rows, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<T><<<grid_for(batch * seq * embd), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), tokens, static_cast<const T*>(wte), static_cast<const T*>(wpe),
        batch * seq, seq, embd, first_row, table_rows);
  });
  return last_error();
}

int copy_block(void* dst, std::int64_t dst_stride, const void* src, std::int64_t src_stride,
               std::int64_t rows, std::int64_t cols, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    copy_block_kernel<T><<<grid_for(rows * cols), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dst), dst_stride, static_cast<const T*>(src), src_stride, rows, cols);
  });
  return last_error();
}

int embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                       std::int64_t batch, std::int64_t seq, std::int64_t embd,
                       std::int64_t first_row, std::int64_t table_rows, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    if (dwte != nullptr) {
      const std::int64_t rows = batch * seq;
      const dim3 grid(static_cast<unsigned>((embd + kThreads - 1) / kThreads),
                      static_cast<unsigned>(rows < 65535 ? rows : 65535));
      embedding_wte_kernel<T><<<grid, kThreads, 0, as_stream(stream)>>>(
          static_cast<T*>(dwte), static_cast<const T*>(dout), tokens, rows, embd, first_row,
          table_rows);
    }
    if (dwpe != nullptr) {
      embedding_wpe_kernel<T><<<grid_for(seq * embd), kThreads, 0, as_stream(stream)>>>(
          static_cast<T*>(dwpe), static_cast<const T*>(dout), batch, seq, embd);
    }
  });
  return last_error();
}

int layernorm_forward(void* out, float* mean, float* rstd, const void* x, const void* weight,
                      const void* bias, std::int64_t rows, std::int64_t dim, DType dt,
                      void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<warps_grid(rows), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), mean, rstd, static_cast<const T*>(x),
        static_cast<const T*>(weight), static_cast<const T*>(bias), rows, static_cast<int>(dim));
  });
  return last_error();
}

int layernorm_backward(void* dx, bool add, void* dweight, void* dbias, const void* dout,
                       const void* x, const void* weight, const float* mean, const float* rstd,
                       std::int64_t rows, std::int64_t dim, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    layernorm_dx_kernel<T><<<warps_grid(rows), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dx), add, static_cast<const T*>(dout), static_cast<const T*>(x),
        static_cast<const T*>(weight), mean, rstd, rows, static_cast<int>(dim));
    if (dweight != nullptr || dbias != nullptr) {
      layernorm_params_kernel<T><<<grid_for(dim), kThreads, 0, as_stream(stream)>>>(
          static_cast<T*>(dweight), static_cast<T*>(dbias), static_cast<const T*>(dout),
          static_cast<const T*>(x), mean, rstd, rows, static_cast<int>(dim));
    }
  });
  return last_error();
}

int broadcast_rows(void* out, const void* bias, std::int64_t rows, std::int64_t cols, DType dt,
                   void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    broadcast_rows_kernel<T><<<grid_for(rows * cols), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), static_cast<const T*>(bias), rows, cols);
  });
  return last_error();
}

int column_sums(void* dbias, const void* dout, std::int64_t rows, std::int64_t cols, DType dt,
                void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    column_sums_kernel<T><<<grid_for(cols), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dbias), static_cast<const T*>(dout), rows, cols);
  });
  return last_error();
}

int gelu_forward(void* out, const void* x, std::int64_t n, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), static_cast<const T*>(x), n);
  });
  return last_error();
}

int gelu_backward(void* dx, bool add, const void* dout, const void* x, std::int64_t n, DType dt,
                  void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dx), add, static_cast<const T*>(dout), static_cast<const T*>(x), n);
  });
  return last_error();
}

int residual_forward(void* out, const void* a, const void* b, std::int64_t n, DType dt,
                     void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    residual_forward_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
  return last_error();
}

int accumulate(void* dst, bool add, const void* src, std::int64_t n, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dst), add, static_cast<const T*>(src), n);
  });
  return last_error();
}

int scale(void* out, bool add, const void* x, const std::uint8_t* keep, float alpha,
          std::int64_t n, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), add, static_cast<const T*>(x), keep, alpha, n);
  });
  return last_error();
}

int cross_entropy(void* dlogits, float* losses, const void* logits, const std::int32_t* targets,
                  std::int64_t rows, std::int64_t vocab, float grad_scale, DType dt,
                  void* stream) {
  const unsigned grid = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dlogits), losses, static_cast<const T*>(logits), targets, rows, vocab,
        grad_scale);
  });
  return last_error();
}

int rmsnorm_forward(void* out, float* rstd, const void* x, const void* weight, float eps,
                    std::int64_t rows, std::int64_t dim, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<T><<<warps_grid(rows), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), rstd, static_cast<const T*>(x), static_cast<const T*>(weight), eps,
        rows, static_cast<int>(dim));
  });
  return last_error();
}

int rmsnorm_backward(void* dx, bool add, void* dweight, const void* dout, const void* x,
                     const void* weight, const float* rstd, std::int64_t rows, std::int64_t dim,
                     DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_dx_kernel<T><<<warps_grid(rows), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dx), add, static_cast<const T*>(dout), static_cast<const T*>(x),
        static_cast<const T*>(weight), rstd, rows, static_cast<int>(dim));
    if (dweight != nullptr) {
      rmsnorm_dweight_kernel<T><<<grid_for(dim), kThreads, 0, as_stream(stream)>>>(
          static_cast<T*>(dweight), static_cast<const T*>(dout), static_cast<const T*>(x), rstd,
          rows, static_cast<int>(dim));
    }
  });
  return last_error();
}

int rope(void* x, const float* inv_freq, std::int64_t batch, std::int64_t seq, std::int64_t heads,
         std::int64_t head_dim, std::int64_t row_stride, std::int64_t pos_offset, bool inverse,
         DType dt, void* stream) {
  const std::int64_t pairs = batch * seq * heads * (head_dim / 2);
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid_for(pairs), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(x), inv_freq, batch * seq, seq, static_cast<int>(heads),
        static_cast<int>(head_dim / 2), row_stride, pos_offset, inverse ? -1.0f : 1.0f);
  });
  return last_error();
}

int swiglu_forward(void* out, const void* gate, const void* up, std::int64_t rows,
                   std::int64_t dim, std::int64_t in_stride, DType dt, void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<T><<<grid_for(rows * dim), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(out), static_cast<const T*>(gate), static_cast<const T*>(up), rows, dim,
        in_stride);
  });
  return last_error();
}

int swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                    std::int64_t rows, std::int64_t dim, std::int64_t in_stride, DType dt,
                    void* stream) {
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<grid_for(rows * dim), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dout),
        static_cast<const T*>(gate), static_cast<const T*>(up), rows, dim, in_stride);
  });
  return last_error();
}

namespace {
GqaShape gqa_shape(const GqaArgs& a) {
  GqaShape s;
  s.tq = a.q_len;
  s.tk = a.kv_len;
  s.off = a.kv_len - a.q_len;
  s.q_stride = a.q_stride;
  s.kv_stride = a.kv_stride;
  s.q_heads = static_cast<int>(a.q_heads);
  s.group = static_cast<int>(a.q_heads / a.kv_heads);
  s.hd = static_cast<int>(a.head_dim);
  s.scale = a.scale;
  return s;
}
}  // namespace

int gqa_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                          const GqaArgs& a, DType dt, void* stream) {
  const GqaShape s = gqa_shape(a);
  const dim3 grid(static_cast<unsigned>((a.q_len + kAttnRows - 1) / kAttnRows),
                  static_cast<unsigned>(a.batch * a.q_heads));
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_hd(s.hd, [&](auto hd) {
      gqa_forward_kernel<T, decltype(hd)::value><<<grid, kAttnRows, 0, as_stream(stream)>>>(
          static_cast<T*>(out), lse, static_cast<const T*>(q), static_cast<const T*>(k),
          static_cast<const T*>(v), s);
    });
  });
  return last_error();
}

int gqa_attention_backward(void* dq, void* dk, void* dv, bool add, float* delta,
                           const void* dout, const void* q, const void* k, const void* v,
                           const void* out, const float* lse, const GqaArgs& a, DType dt,
                           void* stream) {
  const GqaShape s = gqa_shape(a);
  const unsigned blocks = static_cast<unsigned>((a.q_len + kAttnRows - 1) / kAttnRows);
  const dim3 grid_q(blocks, static_cast<unsigned>(a.batch * a.q_heads));
  const dim3 grid_kv(blocks, static_cast<unsigned>(a.batch * a.kv_heads));
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t bhs = a.batch * a.q_heads * a.q_len;
    gqa_delta_kernel<T><<<grid_for(bhs), kThreads, 0, as_stream(stream)>>>(
        delta, static_cast<const T*>(dout), static_cast<const T*>(out), bhs, s);
    dispatch_hd(s.hd, [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      gqa_dq_kernel<T, HD><<<grid_q, kAttnRows, 0, as_stream(stream)>>>(
          static_cast<T*>(dq), add, static_cast<const T*>(dout), static_cast<const T*>(q),
          static_cast<const T*>(k), static_cast<const T*>(v), lse, delta, s);
      gqa_dkv_kernel<T, HD><<<grid_kv, kAttnRows, 0, as_stream(stream)>>>(
          static_cast<T*>(dk), static_cast<T*>(dv), add, static_cast<const T*>(dout),
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, delta,
          s);
    });
  });
  return last_error();
}

}  // namespace tz::ops::cuda_kernels
