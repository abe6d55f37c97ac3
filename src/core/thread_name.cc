#include "core/thread_name.h"

#include <pthread.h>

namespace tz {

void set_thread_name(std::string_view name) {
  char buf[16] = {};
  name.copy(buf, sizeof(buf) - 1);
  // Only fails for a name longer than 15 bytes, which the copy rules out: nothing to report.
  (void)pthread_setname_np(pthread_self(), buf);
}

std::string thread_name() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return "";
  return buf;
}

}  // namespace tz
