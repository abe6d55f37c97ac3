// MpiComm's transport (MPI_Sendrecv / MPI_Barrier) and process-wide MPI set-up (mpi_env.h).
#include "comm/mpi_comm.h"

#if defined(TZ_HAVE_MPI)

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "comm/mpi_env.h"
#include "comm/ring_comm.h"
#include "core/log.h"

namespace tz::comm {

Status mpi_status(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::ok();
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) text[0] = '\0';
  return check_mpi(code, text, what);
}

Status ensure_mpi_initialized() {
  static std::once_flag once;
  static Status init_status;
  std::call_once(once, [] {
    int initialized = 0;
    init_status = TZ_MPI_CHECK(MPI_Initialized(&initialized));
    if (!init_status.is_ok()) return;
    int provided = 0;
    if (initialized) {
      init_status = TZ_MPI_CHECK(MPI_Query_thread(&provided));
    } else {
      init_status =
          TZ_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      if (init_status.is_ok()) {
        std::atexit([] {
          int finalized = 0;
          if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) {
            if (MPI_Finalize() != MPI_SUCCESS) TZ_LOG_WARN("MPI_Finalize failed at exit");
          }
        });
      }
    }
    if (init_status.is_ok() && provided < MPI_THREAD_SERIALIZED) {
      init_status = Status::unavailable(
          "MPI provides thread level " + std::to_string(provided) +
          "; tierzero runs collectives on stream threads and needs MPI_THREAD_SERIALIZED or "
          "better (rebuild MPI with thread support)");
    }
  });
  return init_status;
}

namespace {

// MPI counts are ints: larger messages go in pieces of 1 GiB, split the same way on both sides.
constexpr std::size_t kMaxPieceBytes = 1u << 30;
constexpr int kTag = 7101;

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~MpiTransport() override {
    int finalized = 0;
    if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) {
      Status st = TZ_MPI_CHECK(MPI_Comm_free(&comm_));
      if (!st.is_ok()) TZ_LOG_WARN("%s", st.to_string().c_str());
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status sendrecv(const void* send, std::size_t send_bytes, void* recv,
                  std::size_t recv_bytes) override {
    std::lock_guard lock(mu_);
    const int right = (rank_ + 1) % size_;
    const int left = (rank_ - 1 + size_) % size_;
    std::size_t sent = 0;
    std::size_t got = 0;
    while (sent < send_bytes || got < recv_bytes) {
      const std::size_t s = std::min(kMaxPieceBytes, send_bytes - sent);
      const std::size_t r = std::min(kMaxPieceBytes, recv_bytes - got);
      TZ_MPI_RETURN_IF_ERROR(MPI_Sendrecv(
          static_cast<const char*>(send) + sent, static_cast<int>(s), MPI_BYTE,
          s > 0 ? right : MPI_PROC_NULL, kTag, static_cast<char*>(recv) + got,
          static_cast<int>(r), MPI_BYTE, r > 0 ? left : MPI_PROC_NULL, kTag, comm_,
          MPI_STATUS_IGNORE));
      sent += s;
      got += r;
    }
    return Status::ok();
  }

  Status barrier() override {
    std::lock_guard lock(mu_);
    return TZ_MPI_CHECK(MPI_Barrier(comm_));
  }

 private:
  std::mutex mu_;  // serializes this communicator's MPI calls (MPI_THREAD_SERIALIZED suffices)
  MPI_Comm comm_;
  int rank_;
  int size_;
};

}  // namespace

bool mpi_built() { return true; }

Result<std::unique_ptr<Comm>> MpiComm::create() {
  TZ_RETURN_IF_ERROR(ensure_mpi_initialized());
  MPI_Comm comm = MPI_COMM_NULL;
  TZ_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  // Errors come back as codes (and then as Status) instead of aborting the job.
  TZ_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0;
  int size = 1;
  TZ_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank));
  TZ_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size));
  MPI_Comm node = MPI_COMM_NULL;
  TZ_MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local_rank = 0;
  TZ_MPI_RETURN_IF_ERROR(MPI_Comm_rank(node, &local_rank));
  TZ_MPI_RETURN_IF_ERROR(MPI_Comm_free(&node));
  return std::unique_ptr<Comm>(
      std::make_unique<RingComm>(std::make_unique<MpiTransport>(comm, rank, size), "mpi",
                                 local_rank));
}

}  // namespace tz::comm

#else  // !TZ_HAVE_MPI

namespace tz::comm {

bool mpi_built() { return false; }

Result<std::unique_ptr<Comm>> MpiComm::create() {
  return Status::unavailable("MpiComm: tierzero was built without MPI (TZ_MPI=OFF)");
}

}  // namespace tz::comm

#endif
