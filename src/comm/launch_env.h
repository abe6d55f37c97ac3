// The launcher's rank, world size and local rank for the communicators: gpu/launch_env.h, the
// one reader of the launcher variables (the device choice reads the same local rank there).
#pragma once

#include "gpu/launch_env.h"

namespace tz::comm {

using gpu::detect_launch_env;
using gpu::LaunchEnv;

}  // namespace tz::comm
