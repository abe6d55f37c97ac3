// HF GPT-2 weights through the engine: a save/load round trip is exact (fp32) or exactly the
// rounding (bf16, fp16); files written as transformers writes them (unprefixed names, the tied
// lm_head copy, the old attention-mask buffers, 16-bit dtypes) load; every malformed file gives
// one line naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/hf.h"
#include "model_harness.h"

namespace tz::model {
namespace {

using testing::read_weights;
using testing::Weights;
using testing::with_model;

constexpr std::uint64_t kSeed = 424242;
const char* const kModel = "gpt2:layers=2,heads=2,embd=8,vocab=11,seq=6";

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/tz_model_weights_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The weights of kModel initialised with kSeed.
Weights initial_weights() {
  Weights w;
  Status s = with_model(testing::config_json(testing::kSgd1), kModel, {},
                        [&](zero::Engine& engine, Gpt2& gpt) -> Status {
    TZ_RETURN_IF_ERROR(gpt.init_weights(kSeed));
    TZ_ASSIGN_OR_RETURN(w, read_weights(engine, gpt));
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return w;
}

// Loads `path` into a fresh kModel; returns the load's status and the weights it produced.
Status load(const std::string& path, Weights* out = nullptr) {
  return with_model(testing::config_json(testing::kSgd1), kModel, {},
                    [&](zero::Engine& engine, Gpt2& gpt) -> Status {
    TZ_RETURN_IF_ERROR(gpt.load_safetensors(path));
    if (out != nullptr) {
      TZ_ASSIGN_OR_RETURN(*out, read_weights(engine, gpt));
    }
    return Status::ok();
  });
}

// A safetensors file written by hand (independent of core/safetensors): `header` as given, then
// `data`.
void write_raw(const std::string& path, const nlohmann::json& header, const std::string& data) {
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << text << data;
}

struct Tensor {
  std::string name;
  std::string dtype;  // F32, F16, BF16
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

std::string encode(const Tensor& t) {
  std::string bytes;
  for (float v : t.values) {
    if (t.dtype == "F32") {
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const std::uint16_t bits = t.dtype == "BF16" ? f32_to_bf16(v).bits : f32_to_fp16(v).bits;
      bytes.append(reinterpret_cast<const char*>(&bits), 2);
    }
  }
  return bytes;
}

void write_tensors(const std::string& path, const std::vector<Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const Tensor& t : tensors) {
    const std::string bytes = encode(t);
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  write_raw(path, header, data);
}

// kModel's tensors as transformers' GPT2Model would save them: no prefix, `dtype`.
std::vector<Tensor> hf_tensors(const Weights& w, const std::string& dtype,
                               const std::string& prefix = "") {
  const std::vector<zero::UnitSpec> specs = unit_specs(parse_model(kModel).value());
  std::vector<Tensor> out;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      out.push_back({prefix + hf_tensor_name(specs[u], specs[u].tensors[t]), dtype,
                     specs[u].tensors[t].shape, w[u][t]});
    }
  }
  return out;
}

float round_to(const std::string& dtype, float v) {
  if (dtype == "BF16") return bf16_to_f32(f32_to_bf16(v));
  if (dtype == "F16") return fp16_to_f32(f32_to_fp16(v));
  return v;
}

void expect_weights(const Weights& got, const Weights& want, const std::string& dtype) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t u = 0; u < want.size(); ++u) {
    for (std::size_t t = 0; t < want[u].size(); ++t) {
      for (std::size_t i = 0; i < want[u][t].size(); ++i) {
        ASSERT_EQ(got[u][t][i], round_to(dtype, want[u][t][i])) << u << "/" << t << "[" << i << "]";
      }
    }
  }
}

TEST(WeightsTest, SaveThenLoadIsExactInEveryDtype) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Weights w = initial_weights();
  for (const auto& [dtype, name] : {std::pair{DType::kF32, "F32"}, std::pair{DType::kBF16, "BF16"},
                                    std::pair{DType::kF16, "F16"}}) {
    const std::string dir = temp_dir(name);
    const std::string path = dir + "/model.safetensors";
    Status s = with_model(testing::config_json(testing::kSgd1), kModel, {},
                          [&](zero::Engine&, Gpt2& gpt) -> Status {
      TZ_RETURN_IF_ERROR(gpt.init_weights(kSeed));
      return gpt.save_safetensors(path, dtype);
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    // The file holds HF's names with the prefix, in the saved dtype, and a config beside it.
    Result<SafetensorsReader> reader = SafetensorsReader::open(path);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    ASSERT_NE(reader->find("transformer.h.1.mlp.c_proj.weight"), nullptr);
    EXPECT_EQ(reader->find("transformer.h.1.mlp.c_proj.weight")->dtype, dtype);
    EXPECT_EQ(reader->find("transformer.wte.weight")->shape, (std::vector<std::int64_t>{11, 8}));
    EXPECT_EQ(reader->entries().size(), 4u + 2 * 12);
    EXPECT_EQ(reader->metadata().at("format"), "pt");
    Result<Gpt2Shape> shape = read_hf_config(dir + "/config.json");
    ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
    EXPECT_EQ(shape->param_count(), parse_model(kModel)->param_count());
    Weights back;
    s = load(path, &back);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    expect_weights(back, w, name);
  }
}

TEST(WeightsTest, LoadsHfLayoutsAndIgnoresItsBuffers) {
  const Weights w = initial_weights();
  const std::string dir = temp_dir("hf");
  for (const std::string dtype : {"F32", "BF16", "F16"}) {
    // Unprefixed (GPT2Model) names, the tied head's copy and the old mask buffers.
    std::vector<Tensor> tensors = hf_tensors(w, dtype);
    tensors.push_back({"lm_head.weight", dtype, {11, 8}, w[0][0]});
    tensors.push_back({"h.0.attn.bias", "F32", {1, 1, 6, 6}, std::vector<float>(36, 1.0f)});
    tensors.push_back({"h.1.attn.masked_bias", "F32", {1}, {-1e4f}});
    const std::string path = dir + "/" + dtype + ".safetensors";
    write_tensors(path, tensors);
    Weights back;
    Status s = load(path, &back);
    ASSERT_TRUE(s.is_ok()) << dtype << ": " << s.to_string();
    expect_weights(back, w, dtype);
  }
  // Prefixed (GPT2LMHeadModel) names.
  const std::string path = dir + "/prefixed.safetensors";
  write_tensors(path, hf_tensors(w, "F32", "transformer."));
  Weights back;
  Status s = load(path, &back);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  expect_weights(back, w, "F32");
}

// Each malformed file: one line, naming the file and the tensor at fault.
TEST(WeightsTest, EveryMalformedFileGivesItsOneLineError) {
  const Weights w = initial_weights();
  const std::string dir = temp_dir("bad");
  struct Case {
    std::string what;
    std::string tensor;  // must appear in the message
    std::string detail;  // must appear too
    std::function<void(const std::string&)> make;
  };
  const auto with = [&](std::function<void(std::vector<Tensor>&)> edit) {
    return [&w, edit](const std::string& path) {
      std::vector<Tensor> t = hf_tensors(w, "F32", "transformer.");
      edit(t);
      write_tensors(path, t);
    };
  };
  const auto find = [](std::vector<Tensor>& t, const std::string& name) -> Tensor& {
    for (Tensor& x : t) {
      if (x.name == name) return x;
    }
    ADD_FAILURE() << "no " << name;
    return t[0];
  };
  // A file whose header is written here: each tensor's dtype, bytes and first offset as `entry`
  // leaves them (the data follow in order).
  using Entry = std::function<void(const Tensor&, std::string& dtype, std::string& bytes,
                                   std::uint64_t& begin)>;
  const auto raw = [&](Entry entry) {
    return [&w, entry](const std::string& path) {
      std::vector<Tensor> t = hf_tensors(w, "F32", "transformer.");
      nlohmann::json header = nlohmann::json::object();
      std::string data;
      for (const Tensor& x : t) {
        std::string dtype = x.dtype;
        std::string bytes = encode(x);
        std::uint64_t begin = data.size();
        entry(x, dtype, bytes, begin);
        header[x.name] = {{"dtype", dtype}, {"shape", x.shape},
                          {"data_offsets", {begin, begin + bytes.size()}}};
        data += bytes;
      }
      write_raw(path, header, data);
    };
  };
  std::vector<Case> cases = {
      {"missing", "transformer.h.1.mlp.c_fc.bias", "missing",
       with([](std::vector<Tensor>& t) {
         std::erase_if(t, [](const Tensor& x) { return x.name == "transformer.h.1.mlp.c_fc.bias"; });
       })},
      {"unexpected", "transformer.h.2.ln_1.weight", "unexpected",
       with([](std::vector<Tensor>& t) {
         t.push_back({"transformer.h.2.ln_1.weight", "F32", {8}, std::vector<float>(8, 1.0f)});
       })},
      {"twice", "h.0.ln_2.bias", "given twice",
       with([](std::vector<Tensor>& t) {
         t.push_back({"h.0.ln_2.bias", "F32", {8}, std::vector<float>(8, 0.0f)});
       })},
      {"shape", "transformer.wpe.weight", "shape [7, 8], but model",
       with([&](std::vector<Tensor>& t) {
         Tensor& x = find(t, "transformer.wpe.weight");
         x.shape = {7, 8};
         x.values.resize(56, 0.0f);
       })},
      {"conv1d transposed", "transformer.h.0.attn.c_attn.weight", "shape [24, 8]",
       with([&](std::vector<Tensor>& t) { find(t, "transformer.h.0.attn.c_attn.weight").shape = {24, 8}; })},
      {"lm_head shape", "lm_head.weight", "ties it to wte",
       with([](std::vector<Tensor>& t) {
         t.push_back({"lm_head.weight", "F32", {10, 8}, std::vector<float>(80, 0.0f)});
       })},
      {"dtype", "transformer.ln_f.bias", "dtype",
       raw([](const Tensor& x, std::string& dtype, std::string& bytes, std::uint64_t&) {
         // ln_f.bias declared F64: 8 values of 8 bytes.
         if (x.name != "transformer.ln_f.bias") return;
         bytes.assign(64, '\0');
         dtype = "F64";
       })},
      {"dtype disagrees with bytes", "transformer.h.0.ln_1.weight", "data_offsets",
       raw([](const Tensor& x, std::string& dtype, std::string&, std::uint64_t&) {
         // Declared BF16 but holding 4-byte values: the byte range is twice the shape's.
         if (x.name == "transformer.h.0.ln_1.weight") dtype = "BF16";
       })},
      {"offsets past the end", "transformer.ln_f.bias", "data_offsets",
       raw([](const Tensor& x, std::string&, std::string&, std::uint64_t& begin) {
         if (x.name == "transformer.ln_f.bias") begin += 4096;  // the header lies (last tensor)
       })},
  };
  for (const Case& c : cases) {
    const std::string path = dir + "/" + std::to_string(&c - cases.data()) + ".safetensors";
    c.make(path);
    const Status s = load(path);
    ASSERT_FALSE(s.is_ok()) << c.what;
    const std::string& m = s.message();
    std::printf("%s: %s\n", c.what.c_str(), s.to_string().c_str());
    EXPECT_NE(m.find(path), std::string::npos) << c.what << ": " << m;
    EXPECT_NE(m.find("'" + c.tensor + "'"), std::string::npos) << c.what << ": " << m;
    EXPECT_NE(m.find(c.detail), std::string::npos) << c.what << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << c.what << ": " << m;
  }
  // A file cut short and one that does not exist name the file.
  const std::string good = dir + "/good.safetensors";
  write_tensors(good, hf_tensors(w, "F32", "transformer."));
  std::filesystem::resize_file(good, std::filesystem::file_size(good) - 10);
  Status s = load(good);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.message().find(good), std::string::npos) << s.message();
  s = load(dir + "/absent.safetensors");
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("absent.safetensors"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tz::model
