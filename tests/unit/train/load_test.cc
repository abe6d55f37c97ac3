// Each rank reads only the weights it keeps (model/hf_folder.h load_tensor_part on
// Engine::tensor_range / set_tensor_slice): a folder written by tierzero, loaded on 2 ranks at
// stage 3, costs each rank fewer bytes read than the file holds (counted by the kernel:
// /proc/thread-self/io rchar, the bytes the rank's thread got from read and pread) and lands on the
// same params_xxh3 as the full read every rank did before (set_tensor of each whole tensor), in
// pieces of any size; at stages 0-2, where every rank keeps the full 16-bit parameters, each rank
// reads everything and the weights agree too. A NaN in rank 1's part fails the run with that
// value's line, on every rank (no rank is left waiting in a collective).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/factory.h"
#include "model/hf_folder.h"
#include "train/trainer.h"
#include "zero/engine.h"

namespace tz::train {
namespace {

namespace fs = std::filesystem;

// A Llama (GQA, untied) whose tensors are big enough to span both ranks' shards.
constexpr const char* kConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
  "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false})";

// Bytes this thread has read so far (read, pread), as the kernel counts them.
std::uint64_t thread_bytes_read() {
  std::ifstream in("/proc/thread-self/io");
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "rchar:") return value;
  }
  ADD_FAILURE() << "no rchar in /proc/thread-self/io";
  return 0;
}

zero::EngineOptions engine_options(int stage, const model::ModelDesc& desc,
                                   const model::ModelOptions& mo) {
  ConfigLoad load = load_config_text(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"},
          "zero_optimization": {"stage": )" + std::to_string(stage) + "}}");
  EXPECT_TRUE(load.ok());
  zero::EngineOptions eo;
  eo.config = load.config;
  eo.activation_bytes = model::activation_bytes(desc, mo, DType::kF32);
  return eo;
}

// How a rank puts the folder's weights into its engine.
enum class Load { kModel, kFullTensors, kSmallPieces };

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tz_load_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "src");
    std::ofstream(dir_ / "src" / "config.json") << kConfig;
    auto d = model::resolve_model((dir_ / "src").string());
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    desc_ = *d;
    mo_.micro_batch = 1;
    mo_.seq = 16;
    mo_.cpu_threads = 1;
    // The folder under test: random weights (the family's init, seed 5) saved by tierzero.
    model::ModelDesc fresh = desc_;
    fresh.folder.clear();
    const Status st = zero::run_local_ranks(1, 256u << 20, [&](int, gpu::Device& dev,
                                                               comm::Comm& comm) -> Status {
      TZ_ASSIGN_OR_RETURN(auto engine, zero::Engine::create(engine_options(0, fresh, mo_), dev,
                                                             comm));
      TZ_ASSIGN_OR_RETURN(auto net, model::create_model(fresh, mo_, *engine));
      TZ_RETURN_IF_ERROR(engine->finalize());
      TZ_RETURN_IF_ERROR(net->init_weights(5));
      return net->save_weights((dir_ / "w").string(), DType::kF32);
    });
    ASSERT_TRUE(st.is_ok()) << st.message();
    file_ = (dir_ / "w" / "model.safetensors").string();
    ASSERT_TRUE(fs::exists(file_));
    weights_desc_ = desc_;
    auto w = model::resolve_model((dir_ / "w").string());
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    weights_desc_ = *w;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads the folder on `ranks` ranks at `stage` as `how` says; returns params_xxh3 and each
  // rank's bytes read during the load.
  std::uint64_t load(int ranks, int stage, Load how, std::vector<std::uint64_t>& bytes) {
    bytes.assign(static_cast<std::size_t>(ranks), 0);
    std::uint64_t xxh3 = 0;
    std::mutex mu;
    const Status st = zero::run_local_ranks(ranks, 256u << 20, [&](int rank, gpu::Device& dev,
                                                                   comm::Comm& comm) -> Status {
      TZ_ASSIGN_OR_RETURN(auto engine, zero::Engine::create(
                                           engine_options(stage, weights_desc_, mo_), dev, comm));
      TZ_ASSIGN_OR_RETURN(auto net, model::create_model(weights_desc_, mo_, *engine));
      TZ_RETURN_IF_ERROR(engine->finalize());
      const std::uint64_t before = thread_bytes_read();
      if (how == Load::kModel) {
        TZ_RETURN_IF_ERROR(net->load_weights(weights_desc_.folder));
      } else {
        // Before this change: every rank read every tensor whole and set it (set_tensor).
        TZ_ASSIGN_OR_RETURN(const SafetensorsReader reader, SafetensorsReader::open(file_));
        for (std::size_t u = 0; u < net->unit_count(); ++u) {
          const zero::UnitSpec& spec = net->unit_specs()[u];
          for (std::size_t t = 0; t < spec.tensors.size(); ++t) {
            const SafetensorsEntry* entry = reader.find(spec.tensors[t].name);
            if (entry == nullptr) return Status::not_found(spec.tensors[t].name);
            if (how == Load::kSmallPieces) {
              TZ_RETURN_IF_ERROR(
                  model::load_tensor_part(*engine, net->unit(u), t, reader, *entry, 999));
            } else {
              std::vector<float> v(entry->numel());
              TZ_RETURN_IF_ERROR(reader.read_f32(*entry, v));
              TZ_RETURN_IF_ERROR(engine->set_tensor(net->unit(u), t, v));
            }
          }
        }
      }
      bytes[static_cast<std::size_t>(rank)] = thread_bytes_read() - before;
      TZ_ASSIGN_OR_RETURN(const std::uint64_t h, engine->params_xxh3());
      std::lock_guard<std::mutex> lock(mu);
      if (rank == 0) xxh3 = h;
      return Status::ok();
    });
    EXPECT_TRUE(st.is_ok()) << st.message();
    return xxh3;
  }

  fs::path dir_;
  std::string file_;
  model::ModelDesc desc_;
  model::ModelDesc weights_desc_;
  model::ModelOptions mo_;
};

TEST_F(LoadTest, Stage3RanksReadOnlyTheirShardsAndLandOnTheFullReadsWeights) {
  const std::uint64_t file_bytes = fs::file_size(file_);
  std::vector<std::uint64_t> full_bytes, part_bytes, piece_bytes;
  const std::uint64_t full = load(2, 3, Load::kFullTensors, full_bytes);
  const std::uint64_t part = load(2, 3, Load::kModel, part_bytes);
  const std::uint64_t pieces = load(2, 3, Load::kSmallPieces, piece_bytes);
  EXPECT_EQ(part, full);
  EXPECT_EQ(pieces, full);
  for (int r = 0; r < 2; ++r) {
    // The full read took at least the file's data; each rank's own part is about half of it
    // (headers and the shard padding aside).
    EXPECT_GE(full_bytes[r], file_bytes - 4096) << "rank " << r;
    EXPECT_LT(part_bytes[r], file_bytes * 6 / 10) << "rank " << r;
    EXPECT_LT(piece_bytes[r], file_bytes * 6 / 10) << "rank " << r;
  }
  // Between them the ranks read every tensor's bytes.
  EXPECT_GE(part_bytes[0] + part_bytes[1], file_bytes - 4096);
}

TEST_F(LoadTest, StagesBelow3ReadEverythingAndAgreeWithStage3) {
  std::vector<std::uint64_t> bytes;
  const std::uint64_t s3 = load(2, 3, Load::kFullTensors, bytes);
  for (int stage : {0, 1, 2}) {
    const std::uint64_t h = load(2, stage, Load::kModel, bytes);
    EXPECT_EQ(h, s3) << "stage " << stage;
    EXPECT_GE(bytes[0], fs::file_size(file_) - 4096) << "stage " << stage;
  }
}

TEST_F(LoadTest, NanInOneRanksPartFailsEveryRankWithItsLine) {
  // Element 3 from the end of the last tensor in the file: in rank 1's part at stage 3.
  std::string nan_tensor;
  std::uint64_t nan_elem = 0;
  {
    auto reader = SafetensorsReader::open(file_);
    ASSERT_TRUE(reader.is_ok());
    const SafetensorsEntry& last = reader->entries().back();
    const std::uint64_t header = fs::file_size(file_) - reader->entries().back().end;
    std::fstream f(file_, std::ios::in | std::ios::out | std::ios::binary);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    f.seekp(static_cast<std::streamoff>(header + last.end - 3 * 4));
    f.write(reinterpret_cast<const char*>(&nan), 4);
    nan_tensor = last.name;
    nan_elem = last.numel() - 3;
  }
  TrainSpec s;
  s.engine = engine_options(3, weights_desc_, mo_);
  s.model = weights_desc_;
  s.model_options = mo_;
  s.world = 2;
  s.steps = 1;
  auto t = Trainer::create(s);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  TrainIo io;
  io.print = false;
  const Status st = t->run_local_ranks(256u << 20, io, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("tensor '" + nan_tensor + "': element " +
                              std::to_string(nan_elem) + " is NaN"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace tz::train
