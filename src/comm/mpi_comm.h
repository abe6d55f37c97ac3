// MpiComm: one rank per process over Open MPI (or any MPI), on one host or many; the ring
// algorithms of ring_comm.h over MPI_Sendrecv on a private duplicate of MPI_COMM_WORLD.
// Built when TZ_MPI is on; otherwise create() reports kUnavailable.
#pragma once

#include <memory>

#include "comm/comm.h"

namespace tz::comm {

class MpiComm {
 public:
  // Initializes MPI on first use (MPI_Init_thread, needing at least MPI_THREAD_SERIALIZED,
  // since operations run on stream worker threads; MPI_Finalize runs at process exit) and
  // returns this process's communicator over MPI_COMM_WORLD. Operations run on host-accessible
  // streams; one stream per communicator at a time keeps every rank's order the same.
  // Errors: kUnavailable (built without MPI, thread level too low), kCommError (an MPI call).
  static Result<std::unique_ptr<Comm>> create();
};

// True when MPI support is compiled in.
bool mpi_built();

}  // namespace tz::comm
