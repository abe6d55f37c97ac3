// LocalComm: N ranks as threads of one process (tests, single-host CPU runs). Messages move
// through one mailbox per rank: a sender posts a pointer to its buffer in its right neighbour's
// mailbox and the receiver copies straight out of it, so a message costs one memcpy.
#pragma once

#include <memory>
#include <vector>

#include "comm/comm.h"

namespace tz::comm {

class LocalComm {
 public:
  // `world_size` communicators sharing one group; element r is rank r. Give each rank its own
  // thread and its own stream (two ranks on one stream would wait for each other forever), on a
  // host-accessible device; a group of one rank runs on any device (its collectives are copies
  // on the stream), so one GPU trains without NCCL. The communicators may be destroyed in any order once their
  // operations have completed. kInvalidArgument when world_size < 1.
  static Result<std::vector<std::unique_ptr<Comm>>> create_group(int world_size);
};

}  // namespace tz::comm
