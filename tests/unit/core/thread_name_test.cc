// core/thread_name.h: a name set on a thread reads back, cut at Linux's 15 bytes, and is what
// the kernel shows for the thread (/proc/self/task/TID/comm).
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
    set_thread_name("tz-a-name-longer-than-fifteen");
    EXPECT_EQ(thread_name(), "tz-a-name-longe") << "cut at 15 bytes";
    EXPECT_EQ(kernel_comm(), "tz-a-name-longe");
  });
  t.join();
}

}  // namespace
}  // namespace tz
