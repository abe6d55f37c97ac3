// Private to comm/: process-wide MPI initialization shared by MpiComm and NcclComm (which
// exchanges its unique id over MPI), and the checked-call macro for MPI. Only compiled with
// TZ_HAVE_MPI.
#pragma once

#include <mpi.h>

#include "core/check.h"

namespace tz::comm {

// A Status for the MPI return code `code` of `what` (with MPI_Error_string's text).
Status mpi_status(int code, const char* what);
// Initializes MPI once per process (thread level >= MPI_THREAD_SERIALIZED) and arranges for
// MPI_Finalize at exit if this code initialized it.
Status ensure_mpi_initialized();

}  // namespace tz::comm

#define TZ_MPI_CHECK(call) ::tz::comm::mpi_status((call), #call)
#define TZ_MPI_RETURN_IF_ERROR(call) TZ_RETURN_IF_ERROR(TZ_MPI_CHECK(call))
