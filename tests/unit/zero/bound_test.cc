// The step bound's term choice (zero/accounting.h step_bound_of) as a table: each row's terms and
// the bound and term written out by hand from DESIGN.md's max(compute, NVMe, copy, optimizer);
// where compute and the optimizer share the cores, one term: the union of their busy time (at
// least each of the two), or their sum where the union is unknown; unknown terms (< 0) left out.
// And what a step shows of the disk against the bandwidth probe (disk_shown).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zero/accounting.h"

namespace tz::zero::impl {
namespace {

struct Row {
  std::string name;
  BoundTerms in;
  double seconds;
  std::string term;
};

BoundTerms terms(double compute, double optimizer, double nvme, double copy, bool shared,
                 double shared_busy = -1) {
  BoundTerms t;
  t.shared_busy_s = shared_busy;
  t.compute_s = compute;
  t.optimizer_s = optimizer;
  t.nvme_s = nvme;
  t.copy_s = copy;
  t.shared_cores = shared;
  return t;
}

TEST(StepBound, TermChoiceTable) {
  const std::vector<Row> rows = {
      {"compute alone", terms(2.0, 0.0, -1, -1, false), 2.0, "compute"},
      {"shared cores, union unknown: compute and optimizer add", terms(2.0, 1.5, -1, -1, true),
       3.5, "compute"},
      {"shared: overlapping compute and optimizer count once", terms(2.0, 1.5, -1, -1, true, 2.5),
       2.5, "compute"},
      {"shared: disjoint ones, the union is the sum", terms(2.0, 1.5, -1, -1, true, 3.5), 3.5,
       "compute"},
      {"shared: compute above the union (time outside the engine's calls)",
       terms(3.0, 1.0, -1, -1, true, 2.0), 3.0, "compute"},
      {"shared: optimizer above the union (its time before the window)",
       terms(1.0, 2.5, -1, -1, true, 2.0), 2.5, "compute"},
      {"shared: nvme above the union", terms(2.0, 1.5, 3.0, -1, true, 2.5), 3.0, "nvme"},
      {"shared: union above nvme and copy", terms(2.0, 1.5, 2.4, 2.0, true, 2.5), 2.5, "compute"},
      {"shared: a union of 0", terms(0.0, 0.0, -1, -1, true, 0.0), 0.0, "compute"},
      {"own cores: a union given is not a term", terms(2.0, 1.0, -1, -1, false, 5.0), 2.0,
       "compute"},
      {"shared: nvme below the sum", terms(2.0, 1.5, 3.0, -1, true), 3.5, "compute"},
      {"shared: nvme above the sum", terms(2.0, 1.5, 4.0, -1, true), 4.0, "nvme"},
      {"own cores: optimizer wins", terms(2.0, 3.0, -1, -1, false), 3.0, "optimizer"},
      {"own cores: compute wins", terms(3.0, 2.0, 1.0, 0.5, false), 3.0, "compute"},
      {"own cores: nvme above both", terms(1.0, 2.0, 12.8, 0.5, false), 12.8, "nvme"},
      {"copy above all", terms(1.0, 0.5, 2.0, 2.5, true), 2.5, "copy"},
      {"nvme unknown (< 0), copy wins", terms(1.0, 0.0, -1, 1.5, false), 1.5, "copy"},
      {"a known term of 0 does not win", terms(0.0, 0.0, 0.0, 0.0, true), 0.0, "compute"},
      {"tie compute/nvme: compute", terms(2.0, 0.0, 2.0, -1, false), 2.0, "compute"},
      {"tie nvme/copy: nvme", terms(1.0, 0.0, 2.0, 2.0, false), 2.0, "nvme"},
      {"tie optimizer/compute on own cores: compute", terms(2.0, 2.0, -1, -1, false), 2.0,
       "compute"},
  };
  for (const Row& r : rows) {
    const StepBound b = step_bound_of(r.in);
    EXPECT_DOUBLE_EQ(b.seconds, r.seconds) << r.name;
    EXPECT_EQ(std::string(b.term), r.term) << r.name;
  }
}

// What a step shows of the disk against the probe (disk_shown), rows written out by hand, with a
// probe of 2 GB/s read and 1 GB/s write: the swap disks' own bytes over the longest busy time
// among them, or the store's bytes over the step's time where those give more (a swap file read
// through the page cache); no scale from less than kDiskEvidenceS of either, or without a probe.
TEST(StepBound, DiskShownAgainstTheProbe) {
  auto disk = [](std::string name, double busy, std::uint64_t read, std::uint64_t written) {
    DiskStep d;
    d.device = std::move(name);
    d.busy_fraction = busy;
    d.read_bytes = read;
    d.write_bytes = written;
    return d;
  };
  StepReport r;
  r.step_s = 4.0;
  r.nvme_read_bytes = 2'000'000'000;  // 2 s at the probe: 0.5 of the step
  r.nvme_write_bytes = 1'000'000'000;
  r.disks = {disk("vda", 0.5, 3'000'000'000, 1'000'000'000),
             disk("vdb", 0.25, 1'000'000'000, 1'000'000'000)};
  DiskShown d = disk_shown(r, 2e9, 1e9);
  EXPECT_FALSE(d.by_store);
  EXPECT_EQ(d.read_bytes, 4'000'000'000u);
  EXPECT_EQ(d.write_bytes, 2'000'000'000u);
  EXPECT_DOUBLE_EQ(d.took_s, 2.0);  // vda's 50% of 4 s
  EXPECT_DOUBLE_EQ(d.probe_s, 4.0);
  EXPECT_DOUBLE_EQ(d.scale, 2.0);   // twice what the probe allows

  r.nvme_read_bytes = 9'000'000'000;  // the store moved more than the disks: 13.5 s at the probe
  r.nvme_write_bytes = 9'000'000'000;
  d = disk_shown(r, 2e9, 1e9);
  EXPECT_TRUE(d.by_store);
  EXPECT_EQ(d.read_bytes, 9'000'000'000u);
  EXPECT_DOUBLE_EQ(d.took_s, 4.0);
  EXPECT_DOUBLE_EQ(d.probe_s, 13.5);
  EXPECT_DOUBLE_EQ(d.scale, 3.375);

  r.disks.clear();  // no disk counts: the store's bytes alone
  r.nvme_read_bytes = 2'000'000'000;
  r.nvme_write_bytes = 1'000'000'000;
  d = disk_shown(r, 2e9, 1e9);
  EXPECT_TRUE(d.by_store);
  EXPECT_DOUBLE_EQ(d.probe_s, 2.0);
  EXPECT_DOUBLE_EQ(d.scale, 0.5);  // slower than the probe: no raise comes of it

  r.step_s = 0.2;  // below kDiskEvidenceS
  EXPECT_EQ(disk_shown(r, 2e9, 1e9).scale, 0.0);
  r.step_s = 4.0;
  r.nvme_read_bytes = 0;
  r.nvme_write_bytes = 0;
  r.disks = {disk("vda", 0.05, 1'000'000'000, 0)};  // busy 0.2 s: too little to judge
  EXPECT_EQ(disk_shown(r, 2e9, 1e9).scale, 0.0);
  r.disks = {disk("vda", 0.5, 1'000'000'000, 0)};
  EXPECT_DOUBLE_EQ(disk_shown(r, 2e9, 1e9).scale, 0.25);
  EXPECT_EQ(disk_shown(r, 0, 1e9).scale, 0.0);  // no probe
}

}  // namespace
}  // namespace tz::zero::impl
