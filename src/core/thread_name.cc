// Thread names through pthread_setname_np, shortened to what Linux keeps (thread_name.h).
#include "core/thread_name.h"

#include <pthread.h>

#include <string>

namespace tz {

void set_thread_name(std::string_view name) {
  constexpr std::size_t kMax = 15;  // bytes Linux keeps of a thread's name
  std::string n(name);
  // Names of one family differ at their end ("tz-store pieces h2d", "... d2h"): keep both ends.
  if (n.size() > kMax) n = n.substr(0, 9) + "~" + n.substr(n.size() - 5);
  // Only fails for a name longer than 15 bytes, which the cut rules out: nothing to report.
  (void)pthread_setname_np(pthread_self(), n.c_str());
}

std::string thread_name() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return "";
  return buf;
}

}  // namespace tz
