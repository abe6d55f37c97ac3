// core/thread_name.h: a name set on a thread reads back, shortened to Linux's 15 bytes with both
// ends kept, and is what the kernel shows for the thread (/proc/self/task/TID/comm).
#include "core/thread_name.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

namespace tz {
namespace {

std::string kernel_comm() {
  std::ifstream f("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/comm");
  std::string comm;
  std::getline(f, comm);
  return comm;
}

TEST(ThreadName, SetReadsBackAndTheKernelShowsIt) {
  std::thread t([] {
    set_thread_name("tz-short");
    EXPECT_EQ(thread_name(), "tz-short");
    EXPECT_EQ(kernel_comm(), "tz-short");
    set_thread_name("tz-store pieces h2d");
    EXPECT_EQ(thread_name(), "tz-store ~s h2d") << "both ends kept in 15 bytes";
    EXPECT_EQ(kernel_comm(), "tz-store ~s h2d");
    set_thread_name("tz-store pieces d2h");
    EXPECT_EQ(thread_name(), "tz-store ~s d2h") << "a name of the same family stays distinct";
  });
  t.join();
}

}  // namespace
}  // namespace tz
