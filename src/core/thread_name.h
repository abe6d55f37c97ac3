// Names the calling thread as `top -H`, `ps -L`, gdb and perf show it ("tz-mover", "tz-compute"),
// so that a thread of the engine can be told apart from outside the process (its CPU time, its
// scheduling). Linux keeps 15 bytes of a name: a longer one keeps its first 9 and last 5 bytes
// around a '~' ("tz-store pieces h2d" -> "tz-store ~s h2d").
#pragma once

#include <string>
#include <string_view>

namespace tz {

void set_thread_name(std::string_view name);
// The calling thread's name ("" when it cannot be read).
std::string thread_name();

}  // namespace tz
