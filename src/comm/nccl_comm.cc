// NcclComm (comm/nccl_comm.h): NCCL calls on the stream's cudaStream_t, each checked with
// TZ_NCCL_CHECK; the unique id travels over MPI.
#include "comm/nccl_comm.h"

#if defined(TZ_HAVE_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "comm/launch_env.h"
#include "core/check.h"
#include "core/log.h"
#if defined(TZ_HAVE_MPI)
#include "comm/mpi_env.h"
#endif

#define TZ_NCCL_CHECK(call)                                                                 \
  [&]() -> ::tz::Status {                                                                   \
    const ncclResult_t tz_nccl_rc_ = (call);                                                \
    return ::tz::check_nccl(static_cast<int>(tz_nccl_rc_), ncclGetErrorString(tz_nccl_rc_), \
                            #call);                                                         \
  }()
#define TZ_NCCL_RETURN_IF_ERROR(call) TZ_RETURN_IF_ERROR(TZ_NCCL_CHECK(call))

namespace tz::comm {
namespace {

Status cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return check_cuda(static_cast<int>(err), cudaGetErrorName(err), cudaGetErrorString(err), what);
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

class NcclCommImpl final : public Comm {
 public:
  NcclCommImpl(gpu::Device& device, ncclComm_t comm, int rank, int size, int local_rank,
               gpu::DeviceBuffer scratch)
      : device_(device),
        comm_(comm),
        rank_(rank),
        size_(size),
        local_rank_(local_rank),
        scratch_(std::move(scratch)) {}
  ~NcclCommImpl() override {
    Status st = TZ_NCCL_CHECK(ncclCommDestroy(comm_));
    if (!st.is_ok()) TZ_LOG_ERROR("%s", st.to_string().c_str());
  }

  std::string_view backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }

  Status all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                    gpu::Stream& stream) override {
    TZ_ASSIGN_OR_RETURN(cudaStream_t s, raw(stream));
    TZ_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, s));
    counted(CollectiveOp::kAllGather, count, dtype);
    return Status::ok();
  }
  Status reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                        ReduceOp op, gpu::Stream& stream) override {
    TZ_ASSIGN_OR_RETURN(cudaStream_t s, raw(stream));
    TZ_NCCL_RETURN_IF_ERROR(
        ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, s));
    counted(CollectiveOp::kReduceScatter, count, dtype);
    return Status::ok();
  }
  Status all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                    gpu::Stream& stream) override {
    TZ_ASSIGN_OR_RETURN(cudaStream_t s, raw(stream));
    TZ_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, s));
    counted(CollectiveOp::kAllReduce, count, dtype);
    return Status::ok();
  }
  Status broadcast(void* buffer, std::size_t count, DType dtype, int root,
                   gpu::Stream& stream) override {
    if (root < 0 || root >= size_) {
      return Status::invalid_argument("broadcast: root " + std::to_string(root) + " outside [0, " +
                                      std::to_string(size_) + ")");
    }
    TZ_ASSIGN_OR_RETURN(cudaStream_t s, raw(stream));
    TZ_NCCL_RETURN_IF_ERROR(
        ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root, comm_, s));
    counted(CollectiveOp::kBroadcast, count, dtype, root);
    return Status::ok();
  }
  Status barrier(gpu::Stream& stream) override {
    // NCCL has no barrier: a one-element all-reduce completes only when every rank reaches it.
    TZ_ASSIGN_OR_RETURN(cudaStream_t s, raw(stream));
    TZ_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, comm_, s));
    count(CollectiveOp::kBarrier, 0, 0);
    return Status::ok();
  }
  Status async_error() const override {
    ncclResult_t async = ncclSuccess;
    TZ_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async));
    return check_nccl(static_cast<int>(async), ncclGetErrorString(async), "NCCL async error");
  }

 private:
  Result<cudaStream_t> raw(gpu::Stream& stream) {
    if (&stream.device() != &device_) {
      return Status::invalid_argument("nccl comm: stream belongs to another device");
    }
    TZ_RETURN_IF_ERROR(cuda_check(cudaSetDevice(device_.cuda_ordinal()), "cudaSetDevice"));
    return static_cast<cudaStream_t>(stream.native_handle());
  }
  void counted(CollectiveOp op, std::size_t count_elems, DType dtype, int root = 0) {
    const OpCounters c = ring_bytes(op, size_, rank_, count_elems, dtype_size(dtype), root);
    count(op, c.bytes_sent, c.bytes_received);
  }

  gpu::Device& device_;
  ncclComm_t comm_;
  int rank_;
  int size_;
  int local_rank_;
  gpu::DeviceBuffer scratch_;  // one float for barrier()
};

}  // namespace

bool nccl_built() { return true; }

Result<std::unique_ptr<Comm>> NcclComm::create(gpu::Device& device) {
  if (device.kind() != gpu::DeviceKind::kCuda) {
    return Status::invalid_argument("NcclComm needs a CUDA device, got " + device.name());
  }
  ncclUniqueId id{};
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  // One process makes its own NCCL id: MPI is initialized only when there are ranks to share it
  // with, so a single GPU trains without an MPI runtime (the GPU check's machine has none).
  const LaunchEnv env = detect_launch_env();
  if (env.world_size > 1) {
#if defined(TZ_HAVE_MPI)
    TZ_RETURN_IF_ERROR(ensure_mpi_initialized());
    TZ_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    TZ_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &size));
    if (rank == 0) TZ_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    TZ_MPI_RETURN_IF_ERROR(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    local_rank = env.local_rank;
#else
    return Status::unavailable("NcclComm: " + std::to_string(env.world_size) +
                               " ranks need MPI to exchange the NCCL id; rebuild with TZ_MPI=ON");
#endif
  } else {
    TZ_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  }
  TZ_RETURN_IF_ERROR(cuda_check(cudaSetDevice(device.cuda_ordinal()), "cudaSetDevice"));
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer scratch, device.allocate(sizeof(float)));
  ncclComm_t comm = nullptr;
  TZ_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, size, id, rank));
  return std::unique_ptr<Comm>(
      std::make_unique<NcclCommImpl>(device, comm, rank, size, local_rank, std::move(scratch)));
}

}  // namespace tz::comm

#else  // !TZ_HAVE_NCCL

namespace tz::comm {

bool nccl_built() { return false; }

Result<std::unique_ptr<Comm>> NcclComm::create(gpu::Device& /*device*/) {
  return Status::unavailable("NcclComm: tierzero was built without NCCL (TZ_NCCL=OFF)");
}

}  // namespace tz::comm

#endif
