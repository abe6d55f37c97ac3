// One element of a host buffer of `dtype` elements, read as fp32 or written from fp32: for code
// that walks a tensor value by value (the synthetic models of `bench zero` and the engine tests,
// the tests' checks of the optimizers, devices and collectives). Bulk conversions go through
// Device::cast or the element-wise kernels instead.
#pragma once

#include <cstddef>
#include <cstring>

#include "core/dtype.h"

namespace tz {

// Element i of `data` as fp32. memcpy, so `data` needs no alignment (a byte vector will do).
inline float load_element(const void* data, DType dtype, std::size_t i) {
  const auto* p = static_cast<const unsigned char*>(data) + i * dtype_size(dtype);
  switch (dtype) {
    case DType::kF32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::kBF16: {
      bf16 h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      fp16 h;
      std::memcpy(&h, p, 2);
      return fp16_to_f32(h);
    }
  }
  return 0;
}

// Stores x as element i of `data`, rounded to nearest even (as Device::cast); returns the value
// stored, read back as fp32.
inline float store_element(void* data, DType dtype, std::size_t i, float x) {
  auto* p = static_cast<unsigned char*>(data) + i * dtype_size(dtype);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(p, &x, 4);
      return x;
    case DType::kBF16: {
      const bf16 h = f32_to_bf16(x);
      std::memcpy(p, &h, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      const fp16 h = f32_to_fp16(x);
      std::memcpy(p, &h, 2);
      return fp16_to_f32(h);
    }
  }
  return x;
}

}  // namespace tz
