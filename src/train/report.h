// Rank 0's output while a run goes (train/trainer.h): the step lines on stderr, a progress bar on
// a terminal outside CI, and one --metrics JSON object per step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/output_file.h"
#include "core/progress.h"
#include "zero/engine.h"

namespace tz::train {

// "device X host Y nvme Z", as the step lines and the summary print tier byte counts.
std::string tier_text(const zero::TierBytes& bytes);

// {"nvme_read", "nvme_write", "copy"}: the bandwidths of `engine`'s step bound in bytes per
// second (zero::EngineOptions; 0: not measured, that term is out of the bound), as `train`'s
// summary and metrics lines and `bench zero`'s summary carry them.
nlohmann::ordered_json bandwidth_json(const zero::EngineOptions& engine);

// "compute 1.234 s, optimizer 0.456 s, shared busy 1.500 s, nvme 0.800 s, copy 0.100 s": the
// bound's terms as the summary prints them; unknown terms (< 0) left out.
std::string bound_terms_text(const zero::BoundTerms& t);

class Reporter {
 public:
  // `steps`: the run's last step (the bar's end); a step line every `steps_per_print` steps (and
  // on the last step or with a validation loss); `tokens_per_step` for the tokens/s columns;
  // `bandwidths` (bandwidth_json) go into every metrics line and, where any was measured, into
  // one line before the first step's ("bound bandwidths: disk read 0.41 GB/s, write 0.70 GB/s;
  // copy 9.8 GB/s (memcpy)"; not before, so an error before the first step stays one line);
  // `metrics` (may be null) receives one JSON line per step; `print`: lines and bar on stderr.
  Reporter(int steps, std::uint64_t steps_per_print, std::uint64_t tokens_per_step,
           nlohmann::ordered_json bandwidths, OutputFile* metrics, bool print);

  // One plain line on stderr (clearing the bar's line first on a terminal).
  void line(const std::string& text);
  // One step: its metrics record, its line when due, the bar.
  void step(const zero::StepReport& r, double loss, std::optional<double> val_loss);
  void finish();

 private:
  void write_metrics(const zero::StepReport& r, double loss, std::optional<double> val_loss);
  void announce_bandwidths();

  int steps_;
  std::uint64_t steps_per_print_;
  std::uint64_t tokens_per_step_;
  nlohmann::ordered_json bandwidths_;
  bool first_step_ = true;
  OutputFile* metrics_;
  bool print_;
  bool interactive_ = false;
  std::unique_ptr<Progress> bar_;
};

}  // namespace tz::train
