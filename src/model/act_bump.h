// The families' activation layouts (model/gpt2.cc, model/llama_impl.h) carve every device buffer
// of a micro-batch from one allocation: ActBump hands out byte offsets into it in order, each
// region rounded up to 256 bytes so that every region starts aligned for the kernels' vector
// loads and cuBLAS.
#pragma once

#include <cstddef>

namespace tz::model {

class ActBump {
 public:
  static constexpr std::size_t kAlignBytes = 256;

  // The offset of a new region of `bytes` (the next one starts at the next 256-byte boundary).
  std::size_t take(std::size_t bytes) {
    const std::size_t offset = at_;
    at_ += (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
    return offset;
  }
  // The bytes handed out so far: the allocation's size once the layout is complete.
  std::size_t total() const { return at_; }

 private:
  std::size_t at_ = 0;
};

}  // namespace tz::model
