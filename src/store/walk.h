// The stage-3 training walk over a layered model (one block per layer, every pin on the device):
// forward 0..L-1 reads each layer's parameters, backward L-1..0 pins them read-write (gradient and
// updated parameters written in place, so every layer leaves the device dirty). The order that
// the store's trace policy is measured on; `bench store`, the policy tests and the early
// write-back test all walk it through these functions.
#pragma once

#include <functional>

#include "core/status.h"
#include "store/store.h"

namespace tz::store {

enum class Pass : std::uint8_t { kForward, kBackward };
const char* pass_name(Pass pass);  // "forward" or "backward"

// One pin of the walk: `layer` pinned on the device with `access`.
struct Visit {
  Pass pass = Pass::kForward;
  int layer = 0;
  Access access = Access::kRead;
  bool operator==(const Visit&) const = default;
};

// Called once per visit, in walk order; an error stops the walk and is returned.
using VisitFn = std::function<Status(const Visit&)>;

// Forward: layers 0..layers-1, each kRead.
Status walk_forward(int layers, const VisitFn& visit);
// Backward: layers-1 down to `last` (inclusive), each kReadWrite.
Status walk_backward(int layers, const VisitFn& visit, int last = 0);
// One training step: the forward pass, then the whole backward pass. Ending the step
// (Store::mark_step) is the caller's, after whatever it does between steps.
Status walk_step(int layers, const VisitFn& visit);

}  // namespace tz::store
