// The mover's device work (store_impl.h, "The contract between the store's lock and the device"):
// device calls decided under `mu` as DeviceCalls, issued by the mover once it has let go of `mu`,
// and their results applied when it takes `mu` again.
#include <functional>
#include <utility>
#include <vector>

#include "core/log.h"
#include "store/store_impl.h"

namespace tz::store {

// Queues device work for `op` (issued once the mover lets go of `mu`): ordered after the caller's
// last use of the block's device copy, and reporting to the mailbox when done.
DeviceCall& Store::Impl::push_device_call(DeviceCall::Kind kind, Block& b, const Op& op,
                                          gpu::Stream& stream, std::uint32_t chunk,
                                          int staging_index) {
  DeviceCall& c = device_calls.emplace_back();
  c.kind = kind;
  c.block = b.id;
  c.op_seq = op.seq;
  c.stream = &stream;
  c.user = b.user_event_recorded ? b.user_event.get() : nullptr;
  c.done = DeviceDone{b.id, op.seq, chunk, kind != DeviceCall::Kind::kPiece, staging_index};
  return c;
}

// A whole-block copy or memset on `stream`; with `ready`, the block's ready event follows it
// (Lease::ready_event). A failure fails the op (finish_device_calls).
void Store::Impl::push_whole(Block& b, Op& op, gpu::Stream& stream, std::function<Status()> work,
                             bool ready) {
  op.device_pending = true;
  DeviceCall& c = push_device_call(DeviceCall::Kind::kWhole, b, op, stream);
  c.work = std::move(work);
  if (ready) c.ready = b.ready_event.get();
}

std::function<Status()> Store::Impl::zero_work(Block& b) {
  return [dev = device, dst = b.dev.data(), bytes = b.bytes, s = &device->h2d_stream()] {
    return dev->memset_async(dst, 0, static_cast<std::size_t>(bytes), *s);
  };
}

std::function<Status()> Store::Impl::copy_work(void* dst, const void* src, std::uint64_t bytes,
                                               gpu::CopyKind kind, gpu::Stream& stream) {
  return [dev = device, dst, src, bytes, kind, s = &stream] {
    return dev->copy_async(dst, src, static_cast<std::size_t>(bytes), kind, *s);
  };
}

// Issues one DeviceCall, without `mu`. When a call fails, work already enqueued for it may still
// use the block's buffers: wait for the stream (its callbacks take no store lock) before the op
// fails under `mu`.
void Store::Impl::issue_device_call(DeviceCall& c) {
  if (c.kind == DeviceCall::Kind::kAllocate) {
    auto buf = device->allocate(static_cast<std::size_t>(c.bytes));
    if (buf) {
      c.buffer = std::move(buf).value();
    } else {
      c.status = std::move(buf).take_status();
    }
    return;
  }
  gpu::Stream& s = *c.stream;
  Status st;
  // When the stream cannot wait on the caller's event, the host waits for it instead (slower,
  // same order).
  if (c.user != nullptr && !s.wait(*c.user).is_ok()) {
    st = c.user->synchronize().with_context("store: waiting for the last user of the copy");
  }
  if (st.is_ok() && c.work) st = c.work();
  if (st.is_ok() && c.ready != nullptr) {
    st = c.ready->record(s).with_context("store: recording the ready event");
  }
  if (st.is_ok()) {
    st = device->host_callback(s, [this, done = c.done] {
      // Never `mu` here (store_impl.h): the mailbox only.
      std::lock_guard lock(wake_mu);
      device_done.push_back(done);
      ++events;
      mover_cv.notify_one();
    });
  }
  if (st.is_ok()) return;
  if (c.user != nullptr) (void)c.user->synchronize();
  if (Status sync = s.synchronize(); !sync.is_ok()) {
    TZ_LOG_ERROR("store: stream '%s' after a failed call: %s", s.name().c_str(),
                 sync.to_string().c_str());
  }
  c.status = std::move(st);
}

// Applies the results of the calls issued since the mover let go of `mu`: a successful call's
// completion arrives through the mailbox; a failed one fails its op here (the lease waiting for
// it gets the error), except a free, which the failure only delays.
void Store::Impl::finish_device_calls(std::vector<DeviceCall>& calls) {
  for (DeviceCall& c : calls) {
    Block& b = blocks.at(c.block);
    Op* op = find_op(b, c.op_seq);
    TZ_ASSERT(op != nullptr, "a device call for an op that is not running");
    if (c.check_failed && c.status.is_ok()) {
      fail_op(b, *op, checksum_mismatch(b, c.done.chunk));  // the piece ends with its copy
    }
    if (c.status.is_ok() && c.kind != DeviceCall::Kind::kAllocate) {
      if (c.ready != nullptr) {
        b.issued_seq = std::max(b.issued_seq, op->seq);
        cv.notify_all();  // Lease::ready_event waits for the record
      }
      continue;
    }
    switch (c.kind) {
      case DeviceCall::Kind::kAllocate:
        op->device_pending = false;
        if (c.status.is_ok()) {
          b.dev = std::move(c.buffer);
        } else {
          // The copy is unusable: later reads of the block report this.
          fail_op(b, *op,
                  std::move(c.status).with_context("store: allocating '" + b.name +
                                                   "' in the device tier"));
          op->failed = false;  // the allocation op itself is over; its bytes stay counted
        }                      // until the free that follows (logically present)
        finish_op(b);
        break;
      case DeviceCall::Kind::kWhole:
        op->device_pending = false;
        fail_op(b, *op, std::move(c.status).with_context("store: device call for '" + b.name + "'"));
        if (op->kind == OpKind::kZero) {
          finish_op(b);
        } else {
          finish_copy_if_done(b, *op);
        }
        break;
      case DeviceCall::Kind::kPiece:
        fail_op(b, *op, std::move(c.status).with_context("store: device call for '" + b.name + "'"));
        piece_done(*op, c.done.staging);
        finish_copy_if_done(b, *op);
        break;
      case DeviceCall::Kind::kFree:
        // The host waited for the caller's work and the stream (issue_device_call): free now.
        TZ_LOG_WARN("store: freeing '%s' after a host wait: %s", b.name.c_str(),
                    c.status.to_string().c_str());
        op->device_pending = false;
        free_physical(b, op->dst);
        finish_op(b);
        break;
    }
  }
}

}  // namespace tz::store
