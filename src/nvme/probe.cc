// Probing a directory's filesystem and the kernel's async I/O interfaces, and the engine choice
// built on it.
#include "nvme/probe.h"

#include <fcntl.h>
#include <libaio.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/host_probe.h"
#include "core/log.h"
#include "nvme/file.h"

namespace tz::nvme {

std::string filesystem_name(long magic) {
  switch (static_cast<unsigned long>(magic) & 0xffffffffUL) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x01021994: return "tmpfs";
    case 0x794c7630: return "overlay";
    case 0x9123683E: return "btrfs";
    case 0x2FC12FC1: return "zfs";
    case 0xF2F52010: return "f2fs";
    case 0x6969: return "nfs";
    case 0xFF534D42: return "cifs";
    case 0x65735546: return "fuse";
    case 0x01021997: return "9p";
    case 0x858458f6: return "ramfs";
    case 0xca451a4e: return "bcachefs";
    case 0x00c36400: return "ceph";
    case 0x5346544e: return "ntfs";
    case 0x4d44: return "vfat";
    case 0x9fa0: return "proc";
    case 0x62656572: return "sysfs";
    case 0x73717368: return "squashfs";
    default: break;
  }
  char text[32];
  std::snprintf(text, sizeof text, "0x%lx", static_cast<unsigned long>(magic) & 0xffffffffUL);
  return text;
}

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One aligned write then read through a fresh io_uring with the buffer and file registered.
void probe_uring(int fd, std::uint32_t align, nlohmann::json& out) {
  out = {{"ring", false}, {"registered_buffers", false}, {"fixed_files", false}};
  io_uring ring{};
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    out["error"] = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    return;
  }
  out["ring"] = true;
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, 4096) != 0) {
    out["error"] = "posix_memalign failed";
    io_uring_queue_exit(&ring);
    return;
  }
  std::unique_ptr<void, FreeDeleter> buf(raw);
  std::memset(raw, 0x5a, 4096);
  iovec iov{raw, 4096};
  rc = io_uring_register_buffers(&ring, &iov, 1);
  if (rc == 0) {
    out["registered_buffers"] = true;
  } else {
    out["error"] = std::string("io_uring_register_buffers: ") + std::strerror(-rc) +
                   " (memlock limit? see `ulimit -l`)";
  }
  rc = io_uring_register_files(&ring, &fd, 1);
  if (rc == 0) {
    out["fixed_files"] = true;
  } else if (!out.contains("error")) {
    out["error"] = std::string("io_uring_register_files: ") + std::strerror(-rc);
  }
  // Check that a request actually completes on this filesystem.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  const unsigned len = std::max<std::uint32_t>(align, 512) <= 4096 ? 4096 : 0;
  if (sqe != nullptr && len > 0) {
    const bool fixed_buf = out["registered_buffers"].get<bool>();
    const bool fixed_file = out["fixed_files"].get<bool>();
    const int target = fixed_file ? 0 : fd;
    if (fixed_buf) {
      io_uring_prep_write_fixed(sqe, target, raw, len, 0, 0);
    } else {
      io_uring_prep_write(sqe, target, raw, len, 0);
    }
    if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_cqe* cqe = nullptr;
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc >= 0) rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc < 0) {
      out["ring"] = false;
      out["error"] = std::string("io_uring submit: ") + std::strerror(-rc);
    } else {
      if (cqe->res < 0) {
        out["ring"] = false;
        out["error"] = std::string("io_uring write: ") + std::strerror(-cqe->res);
      }
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  io_uring_queue_exit(&ring);
}

void probe_aio(int fd, nlohmann::json& out) {
  out["libaio"] = false;
  io_context_t ctx = nullptr;
  int rc = io_setup(1, &ctx);
  if (rc < 0) {
    out["libaio_error"] = std::string("io_setup: ") + std::strerror(-rc);
    return;
  }
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, 4096) != 0) {
    out["libaio_error"] = "posix_memalign failed";
    rc = io_destroy(ctx);
    return;
  }
  std::unique_ptr<void, FreeDeleter> buf(raw);
  std::memset(raw, 0xa5, 4096);
  iocb cb{};
  iocb* cbs[1] = {&cb};
  io_prep_pwrite(&cb, fd, raw, 4096, 0);
  rc = io_submit(ctx, 1, cbs);
  if (rc != 1) {
    out["libaio_error"] = std::string("io_submit: ") + std::strerror(rc < 0 ? -rc : EIO);
  } else {
    io_event ev{};
    do {
      rc = io_getevents(ctx, 1, 1, &ev, nullptr);
    } while (rc == -EINTR);
    const long res = static_cast<long>(ev.res);
    if (rc != 1) {
      out["libaio_error"] = std::string("io_getevents: ") + std::strerror(rc < 0 ? -rc : EIO);
    } else if (res < 0) {
      out["libaio_error"] = std::string("write: ") + std::strerror(static_cast<int>(-res));
    } else {
      out["libaio"] = true;
    }
  }
  rc = io_destroy(ctx);
  if (rc < 0 && !out.contains("libaio_error"))
    out["libaio_error"] = std::string("io_destroy: ") + std::strerror(-rc);
}

}  // namespace

nlohmann::json probe_path(const std::string& dir) {
  nlohmann::json out = {{"path", dir},
                        {"filesystem", "unknown"},
                        {"free_bytes", 0},
                        {"total_bytes", 0},
                        {"o_direct", false},
                        {"logical_block_bytes", 0},
                        {"io_uring", {{"ring", false}, {"registered_buffers", false},
                                      {"fixed_files", false}}},
                        {"libaio", false},
                        {"recommended_engine", "psync"}};
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) {
    out["error"] = "statfs " + dir + ": " + std::strerror(errno);
    out["reason"] = "the path cannot be examined";
    return out;
  }
  out["filesystem"] = filesystem_name(static_cast<long>(fs.f_type));
  if (const Result<FilesystemSpace> space = filesystem_space(dir); space.is_ok()) {
    out["free_bytes"] = space->free_bytes;
    out["total_bytes"] = space->total_bytes;
  }
  std::string name = dir + "/.tierzero-probe-XXXXXX";
  int fd = mkostemp(name.data(), O_DIRECT | O_CLOEXEC);
  bool direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) {
    out["error"] = "cannot create a probe file in " + dir + ": " + std::strerror(errno);
    const int err = errno;
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      out["error"] = dir + " is a file, not a folder";
      out["reason"] = "not a folder";
    } else if (err == ENOENT || err == ENOTDIR) {
      out["reason"] = "the folder does not exist";
    } else {
      out["reason"] = "the folder is not writable";
    }
    return out;
  }
  // Unlinked at once: the probe leaves nothing behind even if it is interrupted.
  if (::unlink(name.c_str()) != 0) out["error"] = "unlink " + name + ": " + std::strerror(errno);
  const std::uint32_t align = direct ? direct_io_alignment(fd) : 0;
  if (direct) {
    // Some filesystems accept O_DIRECT at open and refuse it at the first request.
    void* raw = nullptr;
    if (posix_memalign(&raw, 4096, 4096) == 0) {
      std::unique_ptr<void, FreeDeleter> buf(raw);
      std::memset(raw, 0, 4096);
      ssize_t n;
      do {
        n = ::pwrite(fd, raw, 4096, 0);
      } while (n < 0 && errno == EINTR);
      if (n != 4096) {
        direct = false;
        out["o_direct_error"] = std::string("O_DIRECT write: ") +
                                (n < 0 ? std::strerror(errno) : "short write");
      }
    }
  }
  out["o_direct"] = direct;
  out["logical_block_bytes"] = direct ? align : 0;
  nlohmann::json uring;
  probe_uring(fd, align, uring);
  out["io_uring"] = uring;
  probe_aio(fd, out);
  ::close(fd);
  const bool ring = uring["ring"].get<bool>();
  if (!direct) {
    out["recommended_engine"] = "psync";
    out["reason"] = out["filesystem"].get<std::string>() +
                    " does not support O_DIRECT: psync (buffered, through the page cache)";
  } else if (ring && uring["registered_buffers"].get<bool>()) {
    out["recommended_engine"] = "io_uring";
    out["reason"] = "io_uring works with registered buffers" +
                    std::string(uring["fixed_files"].get<bool>() ? " and fixed files" : "") +
                    " and O_DIRECT on " + out["filesystem"].get<std::string>();
  } else if (out["libaio"].get<bool>()) {
    out["recommended_engine"] = "libaio";
    out["reason"] = "io_uring unavailable (" +
                    (uring.contains("error") ? uring["error"].get<std::string>() : "no ring") +
                    "), libaio works";
  } else {
    out["recommended_engine"] = "psync";
    out["reason"] = "neither io_uring nor libaio works here";
  }
  return out;
}

Result<EngineChoice> choose_io_engine(std::string_view requested,
                                      const std::vector<std::string>& paths) {
  EngineChoice choice;
  if (requested != "auto" && !requested.empty()) {
    TZ_ASSIGN_OR_RETURN(choice.kind, parse_io_engine(requested));
    choice.direct = true;
    for (const std::string& p : paths) {
      nlohmann::json j = probe_path(p);
      if (!j["o_direct"].get<bool>()) choice.direct = false;
    }
    choice.reason = "forced by tierzero.io_engine / --engine";
    if (!choice.direct) choice.reason += "; some path has no O_DIRECT, files there are buffered";
    TZ_LOG_INFO("io engine: %s (%s)", io_engine_name(choice.kind), choice.reason.c_str());
    return choice;
  }
  std::string worst = "io_uring";
  std::string reason;
  for (const std::string& p : paths) {
    nlohmann::json j = probe_path(p);
    const std::string rec = j["recommended_engine"].get<std::string>();
    const std::string why = p + ": " + j.value("reason", std::string());
    // The weakest path decides: psync < libaio < io_uring.
    auto rank = [](const std::string& e) { return e == "io_uring" ? 2 : e == "libaio" ? 1 : 0; };
    if (reason.empty() || rank(rec) < rank(worst)) {
      worst = rec;
      reason = why;
    }
  }
  if (paths.empty()) reason = "no swap paths given";
  TZ_ASSIGN_OR_RETURN(choice.kind, parse_io_engine(worst));
  choice.direct = choice.kind != IoEngineKind::kPsync;
  choice.reason = "auto: " + reason;
  if (choice.kind == IoEngineKind::kPsync) {
    TZ_LOG_WARN("io engine: psync (%s); expect lower throughput and page-cache use",
                choice.reason.c_str());
  } else {
    TZ_LOG_INFO("io engine: %s (%s)", io_engine_name(choice.kind), choice.reason.c_str());
  }
  return choice;
}

}  // namespace tz::nvme
