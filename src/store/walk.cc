// The stage-3 walk's visit order (walk.h).
#include "store/walk.h"

namespace tz::store {

const char* pass_name(Pass pass) { return pass == Pass::kForward ? "forward" : "backward"; }

Status walk_forward(int layers, const VisitFn& visit) {
  for (int i = 0; i < layers; ++i) {
    TZ_RETURN_IF_ERROR(visit(Visit{Pass::kForward, i, Access::kRead}));
  }
  return Status::ok();
}

Status walk_backward(int layers, const VisitFn& visit, int last) {
  for (int i = layers - 1; i >= last; --i) {
    TZ_RETURN_IF_ERROR(visit(Visit{Pass::kBackward, i, Access::kReadWrite}));
  }
  return Status::ok();
}

Status walk_step(int layers, const VisitFn& visit) {
  TZ_RETURN_IF_ERROR(walk_forward(layers, visit));
  return walk_backward(layers, visit);
}

}  // namespace tz::store
