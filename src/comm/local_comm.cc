// LocalComm's transport: per-rank mailboxes and a generation barrier (comm/local_comm.h).
#include "comm/local_comm.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "comm/ring_comm.h"

namespace tz::comm {
namespace {

struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  const void* data = nullptr;  // the sender's buffer, valid until the receiver empties the box
  std::size_t bytes = 0;
  bool full = false;
};

struct Group {
  explicit Group(int n) : size(n), boxes(static_cast<std::size_t>(n)) {}
  int size;
  std::vector<Mailbox> boxes;  // boxes[r] holds what rank r-1 sends to rank r
  std::mutex barrier_mu;
  std::condition_variable barrier_cv;
  int arrived = 0;                  // guarded by barrier_mu
  std::uint64_t generation = 0;     // guarded by barrier_mu
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  Status sendrecv(const void* send, std::size_t send_bytes, void* recv,
                  std::size_t recv_bytes) override {
    exchange(send, send_bytes, recv_bytes,
             [&](const void* incoming) { std::memcpy(recv, incoming, recv_bytes); });
    return Status::ok();
  }

  // Reduces straight out of the sender's buffer: one pass over memory instead of copy + add.
  Status sendrecv_reduce(const void* send, std::size_t send_bytes, void* dst, const void* local,
                         std::size_t recv_bytes, DType dtype) override {
    exchange(send, send_bytes, recv_bytes, [&](const void* incoming) {
      reduce_add(dtype, dst, local, incoming, recv_bytes / dtype_size(dtype));
    });
    return Status::ok();
  }

  Status barrier() override {
    std::unique_lock lock(group_->barrier_mu);
    const std::uint64_t gen = group_->generation;
    if (++group_->arrived == group_->size) {
      group_->arrived = 0;
      ++group_->generation;
      group_->barrier_cv.notify_all();
    } else {
      group_->barrier_cv.wait(lock, [&] { return group_->generation != gen; });
    }
    return Status::ok();
  }

 private:
  // Posts `send` in the right neighbour's mailbox, hands the left neighbour's message to
  // `consume` while it is still in the sender's buffer, then waits until ours was taken.
  template <typename Consume>
  void exchange(const void* send, std::size_t send_bytes, std::size_t recv_bytes,
                Consume consume) {
    Mailbox& right = group_->boxes[static_cast<std::size_t>((rank_ + 1) % group_->size)];
    Mailbox& mine = group_->boxes[static_cast<std::size_t>(rank_)];
    if (send_bytes > 0) {  // post first, so that every rank's receive can make progress
      std::lock_guard lock(right.mu);
      TZ_ASSERT(!right.full, "LocalComm: a rank posted before its previous message was taken");
      right.data = send;
      right.bytes = send_bytes;
      right.full = true;
      right.cv.notify_all();
    }
    if (recv_bytes > 0) {
      std::unique_lock lock(mine.mu);
      mine.cv.wait(lock, [&] { return mine.full; });
      TZ_ASSERT(mine.bytes == recv_bytes, "LocalComm: ranks disagree on a message size "
                                          "(different counts in the same collective?)");
      consume(mine.data);
      mine.full = false;
      mine.data = nullptr;
      mine.cv.notify_all();
    }
    if (send_bytes > 0) {  // the buffer stays ours to reuse only once it has been copied out
      std::unique_lock lock(right.mu);
      right.cv.wait(lock, [&] { return !right.full; });
    }
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Comm>>> LocalComm::create_group(int world_size) {
  if (world_size < 1) {
    return Status::invalid_argument("LocalComm: world size " + std::to_string(world_size) +
                                    " must be at least 1");
  }
  auto group = std::make_shared<Group>(world_size);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < world_size; ++r) {
    comms.push_back(
        std::make_unique<RingComm>(std::make_unique<LocalTransport>(group, r), "local", r));
  }
  return comms;
}

}  // namespace tz::comm
