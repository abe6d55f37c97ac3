// IoQueue: cutting, per-file depth limits, retries and short-transfer completion over any
// IoEngine (see io_queue.h for the contract).
#include "nvme/io_queue.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/assert.h"
#include "core/log.h"
#include "core/trace.h"

namespace tz::nvme {

namespace {

std::string request_text(IoOp op, std::uint64_t len, std::uint64_t offset) {
  return std::string(op == IoOp::kRead ? "read of " : "write of ") + std::to_string(len) +
         " bytes at offset " + std::to_string(offset) + (op == IoOp::kRead ? " from" : " to");
}

}  // namespace

Result<IoQueue> IoQueue::create(std::unique_ptr<IoEngine> engine, const IoQueueOptions& options) {
  TZ_ASSERT(engine != nullptr);
  if (options.block_bytes == 0 || options.block_bytes % 4096 != 0 ||
      options.block_bytes > (1ull << 30)) {
    return Status::invalid_argument("io queue: block size " + std::to_string(options.block_bytes) +
                                    " must be a multiple of 4096 bytes and at most 1 GiB");
  }
  if (options.depth_per_file == 0) {
    return Status::invalid_argument("io queue: queue depth must be at least 1");
  }
  return IoQueue(std::move(engine), options);
}

IoQueue::IoQueue(std::unique_ptr<IoEngine> engine, const IoQueueOptions& options)
    : engine_(std::move(engine)), options_(options) {
  const std::uint32_t cap = engine_->capacity();
  slots_.resize(cap);
  free_slots_.reserve(cap);
  for (std::size_t i = cap; i > 0; --i) free_slots_.push_back(i - 1);
  batch_.reserve(cap);
  cqes_.resize(cap);
}

IoQueue::IoQueue(IoQueue&&) noexcept = default;
IoQueue& IoQueue::operator=(IoQueue&&) noexcept = default;

IoQueue::~IoQueue() {
  if (!engine_) return;
  // The kernel may still write into buffers of requests in flight: wait for them.
  while (engine_->in_flight() > 0) {
    auto n = engine_->reap(cqes_, 1);
    if (!n.is_ok()) {
      TZ_LOG_ERROR("io queue: reaping at shutdown failed: %s", n.status().to_string().c_str());
      break;
    }
  }
}

Result<int> IoQueue::add_file(const IoFile& file) {
  TZ_ASSIGN_OR_RETURN(const int slot, engine_->add_file(file.fd));
  FileState fs;
  fs.info = file;
  if (fs.info.align_bytes == 0) fs.info.align_bytes = 4096;
  fs.slot = slot;
  files_.push_back(std::move(fs));
  return static_cast<int>(files_.size() - 1);
}

Status IoQueue::register_buffers(std::span<const iovec> regions) {
  return engine_->register_buffers(regions);
}

Result<IoOpId> IoQueue::start(std::span<const Transfer> transfers) {
  // Validate everything first so a rejected operation submits nothing.
  for (const Transfer& t : transfers) {
    if (t.file < 0 || static_cast<std::size_t>(t.file) >= files_.size()) {
      return Status::invalid_argument("io queue: unknown file id " + std::to_string(t.file));
    }
    const IoFile& f = files_[static_cast<std::size_t>(t.file)].info;
    if (t.len == 0 || t.buf == nullptr) {
      return Status::invalid_argument("io queue: empty transfer or null buffer for " + f.path);
    }
    if (f.direct) {
      const std::uint64_t a = f.align_bytes;
      const auto addr = reinterpret_cast<std::uintptr_t>(t.buf);
      std::string bad;
      if (addr % a != 0) {
        char text[64];
        std::snprintf(text, sizeof text, "buffer address %p is not", t.buf);
        bad = text;
      } else if (t.offset % a != 0) {
        bad = "offset " + std::to_string(t.offset) + " is not";
      } else if (t.len % a != 0) {
        bad = "length " + std::to_string(t.len) + " is not";
      }
      if (!bad.empty()) {
        return Status(ErrorCode::kInvalidArgument, EINVAL,
                      "O_DIRECT on " + f.path + " needs buffer, offset and length aligned to " +
                          std::to_string(a) + " bytes: " + bad + " (" +
                          request_text(t.op, t.len, t.offset) + " " + f.path + ")");
      }
    }
  }
  const IoOpId id = next_op_++;
  OpState& op = ops_[id];
  if (Trace::global().enabled()) {
    op.start_us = Trace::global().now_us();
    bool reads = false, writes = false;
    for (const Transfer& t : transfers) {
      op.bytes += t.len;
      (t.op == IoOp::kRead ? reads : writes) = true;
    }
    op.name = reads && writes ? "nvme read+write" : reads ? "nvme read" : "nvme write";
  }
  for (const Transfer& t : transfers) {
    FileState& f = files_[static_cast<std::size_t>(t.file)];
    for (std::uint64_t done = 0; done < t.len; done += options_.block_bytes) {
      Chunk c;
      c.op = id;
      c.kind = t.op;
      c.file = t.file;
      c.offset = c.orig_offset = t.offset + done;
      c.buf = static_cast<std::byte*>(t.buf) + done;
      c.len = c.orig_len = std::min(options_.block_bytes, t.len - done);
      f.pending.push_back(c);
      ++op.chunks_left;
    }
  }
  fill();
  if (!batch_.empty()) {
    // fill() leaves the batch for pump(); submit now so work starts before the first wait.
    TZ_RETURN_IF_ERROR(pump(false));
  }
  return id;
}

void IoQueue::fill() {
  const std::uint32_t cap = engine_->capacity();
  if (files_.empty()) return;
  // Round-robin over files so striped transfers keep every drive busy.
  bool progress = true;
  while (progress && engine_->in_flight() + batch_.size() < cap) {
    progress = false;
    for (std::size_t k = 0; k < files_.size() && engine_->in_flight() + batch_.size() < cap; ++k) {
      const std::size_t fi = (next_file_ + k) % files_.size();
      FileState& f = files_[fi];
      if (f.pending.empty() || f.in_flight >= options_.depth_per_file) continue;
      Chunk c = f.pending.front();
      f.pending.pop_front();
      auto it = ops_.find(c.op);
      TZ_ASSERT(it != ops_.end());
      if (it->second.failed) {
        // The operation already failed: drop the rest of its work.
        --it->second.chunks_left;
        trace_if_done(it->second);
        progress = true;
        continue;
      }
      TZ_ASSERT(!free_slots_.empty());
      const std::size_t slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = c;
      IoRequest r;
      r.op = c.kind;
      r.file = f.slot;
      r.offset = c.offset;
      r.buf = c.buf;
      r.len = static_cast<std::uint32_t>(c.len);
      r.user_data = slot;
      batch_.push_back(r);
      ++f.in_flight;
      in_flight_bytes_ += c.len;
      progress = true;
    }
    next_file_ = (next_file_ + 1) % files_.size();
  }
  stats_.max_in_flight_bytes = std::max(stats_.max_in_flight_bytes, in_flight_bytes_);
}

void IoQueue::finish_chunk(const Chunk& c, Status status) {
  auto it = ops_.find(c.op);
  TZ_ASSERT(it != ops_.end());
  OpState& op = it->second;
  if (!status.is_ok() && !op.failed) {
    op.failed = true;
    op.status = std::move(status);
    // Drop the operation's work that has not started; requests in flight finish normally.
    for (FileState& f : files_) {
      const auto before = f.pending.size();
      std::erase_if(f.pending, [&](const Chunk& p) { return p.op == c.op; });
      op.chunks_left -= before - f.pending.size();
    }
  }
  TZ_ASSERT(op.chunks_left > 0);
  --op.chunks_left;
  trace_if_done(op);
}

void IoQueue::trace_if_done(const OpState& op) const {
  if (op.chunks_left != 0 || op.start_us < 0) return;
  Trace& trace = Trace::global();
  const std::string args = "{\"bytes\": " + std::to_string(op.bytes) +
                           ", \"ok\": " + (op.failed ? "false" : "true") + "}";
  trace.span("nvme", op.name, op.start_us, trace.now_us(), args);
}

void IoQueue::complete(std::size_t slot, std::int64_t result) {
  TZ_ASSERT(slot < slots_.size());
  Chunk c = slots_[slot];
  free_slots_.push_back(slot);
  FileState& f = files_[static_cast<std::size_t>(c.file)];
  TZ_ASSERT(f.in_flight > 0);
  --f.in_flight;
  in_flight_bytes_ -= c.len;
  const bool op_failed = ops_.at(c.op).failed;

  if (result < 0) {
    const int err = static_cast<int>(-result);
    if ((err == EINTR || err == EAGAIN) && !op_failed &&
        c.retries < options_.max_transient_retries) {
      ++c.retries;
      ++stats_.transient_retries;
      f.pending.push_front(c);
      return;
    }
    Status st = Status::from_errno(
        err, request_text(c.kind, c.orig_len, c.orig_offset) + " " + f.info.path +
                 (c.len != c.orig_len
                      ? " (failed after " + std::to_string(c.orig_len - c.len) + " bytes)"
                      : std::string()),
        {});
    finish_chunk(c, std::move(st));
    return;
  }
  const auto n = static_cast<std::uint64_t>(result);
  TZ_ASSERT(n <= c.len, "engine reported more bytes than requested");
  if (c.kind == IoOp::kRead) {
    stats_.bytes_read += n;
  } else {
    stats_.bytes_written += n;
  }
  if (n == c.len) {
    finish_chunk(c, Status::ok());
    return;
  }
  if (n == 0) {
    // No progress: a read past the end of the file, or a write the filesystem cannot take.
    const int err = c.kind == IoOp::kRead ? EIO : ENOSPC;
    finish_chunk(c, Status::from_errno(
                        err, request_text(c.kind, c.orig_len, c.orig_offset) + " " +
                                 f.info.path + ": transferred 0 of the remaining " +
                                 std::to_string(c.len) + " bytes at offset " +
                                 std::to_string(c.offset) +
                                 (c.kind == IoOp::kRead ? " (end of file)" : "")));
    return;
  }
  // Short transfer: resubmit the remainder first so order within the file is kept.
  ++stats_.short_transfers;
  c.offset += n;
  c.buf += n;
  c.len -= n;
  if (op_failed) {
    finish_chunk(c, Status::ok());
    return;
  }
  f.pending.push_front(c);
}

Status IoQueue::pump(bool block) {
  // Queues what the free depth allows (fill) and hands it to the engine.
  const auto fill_and_submit = [this]() -> Status {
    fill();
    if (batch_.empty()) return Status::ok();
    stats_.requests += batch_.size();
    Status st = engine_->submit(batch_);
    batch_.clear();
    return std::move(st).with_context("io queue: submit");
  };
  TZ_RETURN_IF_ERROR(fill_and_submit());
  if (engine_->in_flight() == 0) return Status::ok();
  TZ_ASSIGN_OR_RETURN(const std::size_t n, engine_->reap(cqes_, block ? 1 : 0));
  for (std::size_t i = 0; i < n; ++i) {
    complete(static_cast<std::size_t>(cqes_[i].user_data), cqes_[i].result);
  }
  // Refill at once: completions free depth, and pending work should not wait a round trip.
  if (n > 0) TZ_RETURN_IF_ERROR(fill_and_submit());
  // A blocking caller comes straight back to reap (submit and wait in one syscall); anyone else
  // needs the requests in the kernel now.
  if (!block) TZ_RETURN_IF_ERROR(engine_->flush());
  return Status::ok();
}

Status IoQueue::poll() { return pump(false); }

bool IoQueue::done(IoOpId id) const {
  auto it = ops_.find(id);
  return it == ops_.end() || it->second.chunks_left == 0;
}

Status IoQueue::wait(IoOpId id) {
  auto it = ops_.find(id);
  TZ_ASSERT(it != ops_.end(), "wait on an unknown or already awaited operation");
  while (it->second.chunks_left > 0) {
    TZ_RETURN_IF_ERROR(pump(true));
    it = ops_.find(id);
  }
  Status st = std::move(it->second.status);
  ops_.erase(it);
  return st;
}

Status IoQueue::run(std::span<const Transfer> transfers) {
  TZ_ASSIGN_OR_RETURN(const IoOpId id, start(transfers));
  return wait(id);
}

}  // namespace tz::nvme
