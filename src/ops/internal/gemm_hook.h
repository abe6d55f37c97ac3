// Internal to ops/ (and its tests): a seam in ops/gemm.h's cpu_sgemm. The hook runs on the calling
// thread after everything on the path to the library call and right before it, so a test can make
// two callers meet there (a rendezvous neither can pass alone) and prove that nothing on the path
// serialises them: a process-wide lock would keep the second caller out while the first waits.
#pragma once

namespace tz::ops::internal {

using SgemmEntryHook = void (*)();

// Installs `hook` (nullptr removes it) for every later cpu_sgemm call in the process. For tests.
void set_sgemm_entry_hook(SgemmEntryHook hook);

}  // namespace tz::ops::internal
