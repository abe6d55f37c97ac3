// Backend selection for collectives (comm/select.h).
#include "comm/select.h"

#include <string>

#include "comm/launch_env.h"
#include "comm/local_comm.h"
#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"

namespace tz::comm {

Result<CommBackend> parse_comm_backend(std::string_view text) {
  if (text == "auto") return CommBackend::kAuto;
  if (text == "local") return CommBackend::kLocal;
  if (text == "mpi") return CommBackend::kMpi;
  if (text == "nccl") return CommBackend::kNccl;
  return Status::invalid_argument("comm backend '" + std::string(text) +
                                  "': expected one of auto, local, mpi, nccl");
}

Result<std::unique_ptr<Comm>> open_comm(gpu::Device& device, CommBackend backend) {
  if (backend == CommBackend::kAuto) {
    if (device.kind() == gpu::DeviceKind::kCuda && nccl_built()) {
      backend = CommBackend::kNccl;
    } else if (detect_launch_env().world_size > 1) {
      backend = CommBackend::kMpi;
    } else {
      backend = CommBackend::kLocal;
    }
  }
  switch (backend) {
    case CommBackend::kNccl:
      return NcclComm::create(device);
    case CommBackend::kMpi:
      return MpiComm::create();
    case CommBackend::kLocal:
    case CommBackend::kAuto: {
      TZ_ASSIGN_OR_RETURN(auto group, LocalComm::create_group(1));
      return std::move(group.front());
    }
  }
  return Status::internal("open_comm: unknown backend");
}

}  // namespace tz::comm
