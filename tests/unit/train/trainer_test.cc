// The training loop as a library (train/trainer.h): a tiny model of each family (GPT-2; Llama
// with GQA, untied; Qwen2 with q/k/v biases, tied; Qwen3 with q/k norms and head_dim != hidden /
// heads) trained for a few steps on a learnable corpus, on 1 rank and on 2 ranks as threads.
// Checked against independent facts, not against the loop itself:
// - the loss is finite and falls well below ln(vocab) on a periodic corpus;
// - 1 rank with 2 accumulated micro-batches and 2 ranks with 1 each see the same sequences per
//   step, so their losses agree to 1e-4 (fp32 sums in another order, as e2e.train.resume checks);
// - stage 0 and stage 3 on 2 ranks end with the same params_xxh3, bit for bit (the engine's
//   promise, as e2e.train.matrix checks);
// - a run stopped after step 3 (the stop callback, as Ctrl-C) saves a checkpoint, and resuming
//   it to step 6 lands on the uninterrupted run's params_xxh3;
// - the metrics file holds one record per step with the losses the result reports.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "model/factory.h"
#include "train/trainer.h"

namespace tz::train {
namespace {

namespace fs = std::filesystem;

constexpr int kSeq = 16;

struct Family {
  const char* name;
  const char* config_json;  // a config.json (Llama family) or empty for GPT-2
};

const Family kFamilies[] = {
    {"gpt2", ""},
    {"llama",
     R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32,
         "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 16,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
         "hidden_act": "silu"})"},
    {"qwen2",
     R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32,
         "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 16,
         "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
         "hidden_act": "silu"})"},
    {"qwen3",
     R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 32,
         "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 16,
         "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
         "hidden_act": "silu"})"},
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

class TrainerTest : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tz_trainer_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // A corpus a tiny model learns in a few steps: the alphabet repeated (bytes, vocab
    // 256). Its period does not divide the sequence length, so consecutive sequences differ and a
    // resumed run that read from the wrong position would train on other batches.
    std::string corpus;
    for (int i = 0; i < 200; ++i) corpus += "abcdefghijklmnopqrstuvwxyz";
    std::ofstream(dir_ / "train.txt") << corpus;
    const Family& f = GetParam();
    if (std::string(f.config_json).empty()) {
      auto d = model::resolve_model("gpt2:layers=2,heads=2,embd=32,vocab=256,seq=16");
      ASSERT_TRUE(d.is_ok()) << d.status().message();
      desc_ = *d;
    } else {
      fs::create_directories(dir_ / "model");
      std::ofstream(dir_ / "model" / "config.json") << f.config_json;
      auto d = model::resolve_model((dir_ / "model").string());
      ASSERT_TRUE(d.is_ok()) << d.status().message();
      desc_ = *d;
      desc_.folder.clear();  // no weights there: the family's initialisation
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A spec: `world` ranks with `accumulation` micro-batches of 2 sequences each, stage `stage`.
  TrainSpec spec(int world, int accumulation, int stage, int steps = 6) const {
    const std::string config =
        R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
        std::to_string(accumulation) +
        R"(, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": )" +
        std::to_string(stage) + "}}";
    ConfigLoad load = load_config_text(config);
    EXPECT_TRUE(load.ok());
    TrainSpec s;
    s.engine.config = load.config;
    s.model = desc_;
    s.model_options.micro_batch = 2;
    s.model_options.seq = kSeq;
    s.model_options.cpu_threads = 1;
    s.engine.activation_bytes = model::activation_bytes(desc_, s.model_options, DType::kF32);
    s.engine.seed = 7;
    s.seed = 7;
    s.world = world;
    s.steps = steps;
    s.data = (dir_ / "train.txt").string();
    return s;
  }

  static TrainResult run(TrainSpec s, const TrainIo& io = quiet()) {
    TrainResult r;
    auto t = Trainer::create(std::move(s));
    EXPECT_TRUE(t.is_ok()) << t.status().message();
    if (!t.is_ok()) return r;
    const Status st = t->run_local_ranks(256u << 20, io, &r);
    EXPECT_TRUE(st.is_ok()) << st.message();
    return r;
  }
  static TrainIo quiet() {
    TrainIo io;
    io.print = false;
    return io;
  }

  fs::path dir_;
  model::ModelDesc desc_;
};

TEST_P(TrainerTest, LossFallsAndRanksAndStagesAgree) {
  const TrainResult one = run(spec(1, 2, 0));
  ASSERT_EQ(one.losses.size(), 6u);
  for (double l : one.losses) ASSERT_TRUE(std::isfinite(l)) << GetParam().name;
  // ln(256) = 5.55 at the start; a period-26 pattern is learnt far below it within 6 steps.
  EXPECT_GT(one.losses.front(), 4.5);
  EXPECT_LT(one.losses.back(), one.losses.front() - 1.0) << GetParam().name;

  const TrainResult two = run(spec(2, 1, 0));
  ASSERT_EQ(two.losses.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(two.losses[i], one.losses[i], 1e-4 * std::abs(one.losses[i]))
        << GetParam().name << " step " << i + 1;
  }
  const TrainResult three = run(spec(2, 1, 3));
  EXPECT_EQ(three.params_xxh3, two.params_xxh3) << GetParam().name;
  EXPECT_EQ(three.losses, two.losses);
  EXPECT_EQ(three.params, desc_.param_count());
}

TEST_P(TrainerTest, StoppedRunResumesToTheUninterruptedWeights) {
  const TrainResult whole = run(spec(2, 1, 3));
  TrainSpec first = spec(2, 1, 3);
  first.save_dir = (dir_ / "ck").string();
  TrainIo io = quiet();
  io.stop = [](std::int64_t step) { return step == 3; };
  const TrainResult stopped = run(first, io);
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_EQ(stopped.steps, 3);
  ASSERT_EQ(stopped.checkpoints.size(), 1u);
  EXPECT_TRUE(fs::exists(fs::path(stopped.checkpoints[0]) / "manifest.json"));
  EXPECT_NE(stopped.params_xxh3, whole.params_xxh3);

  TrainSpec rest = spec(2, 1, 0);  // resumed at another stage: the checkpoint is by parameter
  rest.resume = (dir_ / "ck").string();
  const TrainResult resumed = run(rest);
  EXPECT_FALSE(resumed.interrupted);
  EXPECT_EQ(resumed.steps, 6);
  ASSERT_EQ(resumed.losses.size(), 3u);  // steps 4..6
  EXPECT_EQ(resumed.params_xxh3, whole.params_xxh3) << GetParam().name;
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 3, whole.losses.end()));
}

// A resumed run prints no "step 0" validation loss: that is the starting weights', and before
// the checkpoint loaded it was the fresh initialisation's (the resumed run starts from no
// initialisation at all now). Its last validation loss is the uninterrupted run's.
TEST_P(TrainerTest, ResumedRunPrintsNoStepZeroValidation) {
  TrainSpec whole_spec = spec(1, 1, 3, 4);
  whole_spec.val_data = whole_spec.data;
  whole_spec.val_batches = 2;
  whole_spec.eval_every = 2;
  TrainIo loud = quiet();
  loud.print = true;
  ::testing::internal::CaptureStderr();
  const TrainResult whole = run(whole_spec, loud);
  const std::string whole_out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(whole_out.find("step 0 | val loss"), std::string::npos) << whole_out;

  TrainSpec first = whole_spec;
  first.steps = 2;
  first.save_dir = (dir_ / "ck").string();
  run(first);
  TrainSpec rest = whole_spec;
  rest.resume = (dir_ / "ck").string();
  ::testing::internal::CaptureStderr();
  const TrainResult resumed = run(rest, loud);
  const std::string resumed_out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(resumed_out.find("resumed from"), std::string::npos) << resumed_out;
  EXPECT_EQ(resumed_out.find("step 0 | val loss"), std::string::npos) << resumed_out;
  ASSERT_TRUE(whole.val_loss.has_value() && resumed.val_loss.has_value());
  EXPECT_EQ(*resumed.val_loss, *whole.val_loss) << GetParam().name;
  EXPECT_EQ(resumed.params_xxh3, whole.params_xxh3) << GetParam().name;
}

TEST_P(TrainerTest, MetricsHoldOneRecordPerStep) {
  const std::string path = (dir_ / "metrics.jsonl").string();
  auto out = OutputFile::create("--metrics", path, {});
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  OutputFile file = std::move(out).value();
  TrainIo io = quiet();
  io.metrics = &file;
  const TrainResult r = run(spec(2, 1, 2, 4), io);
  ASSERT_TRUE(file.commit().is_ok());
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 4u);
  ASSERT_EQ(r.losses.size(), 4u);
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i]["step"].get<int>(), static_cast<int>(i) + 1);
    EXPECT_EQ(records[i]["loss"].get<double>(), r.losses[i]);
    EXPECT_TRUE(std::isfinite(records[i]["grad_norm"].get<double>()));
    EXPECT_GT(records[i]["grad_norm"].get<double>(), 0);
  }
}

TEST(TrainerCreate, RefusesWhatNoRankCouldRun) {
  auto d = model::resolve_model("gpt2:layers=1,heads=2,embd=16,vocab=256,seq=8");
  ASSERT_TRUE(d.is_ok());
  TrainSpec s;
  s.model = *d;
  s.model_options.micro_batch = 2;
  s.model_options.seq = 16;  // longer than the model's 8 positions
  auto t = Trainer::create(s);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("seq 16"), std::string::npos) << t.status().message();
  s.model_options.seq = 8;
  s.eval_every = 2;
  t = Trainer::create(s);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("eval_every"), std::string::npos);
  s.eval_every = 0;
  s.data = "/nonexistent/corpus.bin";
  t = Trainer::create(s);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("/nonexistent/corpus.bin"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Families, TrainerTest, ::testing::ValuesIn(kFamilies),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace tz::train
