// Status, Result and the checked-call helpers.
#include <gtest/gtest.h>

#include <cerrno>

#include "core/check.h"
#include "core/status.h"

namespace tz {
namespace {

Result<int> half(int x) {
  if (x % 2) return Status::invalid_argument("odd");
  return x / 2;
}

Result<int> quarter(int x) {
  TZ_ASSIGN_OR_RETURN(int h, half(x));
  TZ_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status fails_on_odd(int x) {
  TZ_RETURN_IF_ERROR(half(x).status());
  return Status::ok();
}

TEST(Status, ResultPropagation) {
  EXPECT_EQ(*quarter(8), 2);
  EXPECT_FALSE(quarter(6).is_ok());
  EXPECT_EQ(quarter(6).status().message(), "odd");
  EXPECT_TRUE(fails_on_odd(4).is_ok());
  EXPECT_EQ(fails_on_odd(3).code(), ErrorCode::kInvalidArgument);
}

TEST(Status, ErrnoClassification) {
  const Status s = Status::from_errno(ENOSPC, "swap write", "/nvme/x");
  EXPECT_EQ(s.code(), ErrorCode::kNoSpace);
  EXPECT_EQ(s.sys_code(), ENOSPC);
  EXPECT_NE(s.message().find("swap write /nvme/x"), std::string::npos);
  EXPECT_NE(s.to_string().find("no_space"), std::string::npos);
  EXPECT_EQ(Status::from_errno(EIO, "read").code(), ErrorCode::kIoError);
  EXPECT_EQ(Status::from_errno(ENOMEM, "mmap").code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(std::move(Status::from_errno(EIO, "read")).with_context("layer 3").message().rfind(
                "layer 3: read", 0),
            0u);
}

TEST(Status, CheckedCalls) {
  EXPECT_TRUE(check_posix(0, "x").is_ok());
  errno = EACCES;
  EXPECT_EQ(check_posix(-1, "open", "/root").code(), ErrorCode::kPermission);
  EXPECT_EQ(check_neg_errno(-EIO, "cqe").sys_code(), EIO);
  EXPECT_TRUE(check_neg_errno(4096, "cqe").is_ok());
  const Status cuda = check_cuda(2, "cudaErrorMemoryAllocation", "out of memory", "cudaMalloc");
  EXPECT_EQ(cuda.code(), ErrorCode::kDeviceError);
  EXPECT_NE(cuda.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_EQ(check_nccl(3, "internal error", "ncclAllGather").code(), ErrorCode::kCommError);
  EXPECT_EQ(check_mpi(5, "bad count", "MPI_Allgather").sys_code(), 5);
  EXPECT_TRUE(check_cuda(0, "", "", "x").is_ok());
}

TEST(StatusDeathTest, AssertAborts) {
  EXPECT_DEATH(TZ_ASSERT(1 + 1 == 3, "math is broken"), "math is broken");
  EXPECT_DEATH((void)half(3).value(), "odd");
}

}  // namespace
}  // namespace tz
