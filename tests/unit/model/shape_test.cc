// GPT-2 shapes: the presets' parameter counts against HF's published ones, the unit layout
// against the count, custom shapes, and every malformed shape naming its field.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "model/gpt2.h"
#include "model/hf.h"

namespace tz::model {
namespace {

TEST(Gpt2ShapeTest, PresetsHaveHfsShapesAndCounts) {
  struct Want {
    const char* name;
    int layers, heads, embd;
    std::uint64_t params;  // sum of GPT2LMHeadModel's parameters (tied head counted once)
  };
  for (const Want& w : {Want{"gpt2-124m", 12, 12, 768, 124439808},
                        Want{"gpt2-350m", 24, 16, 1024, 354823168},
                        Want{"gpt2-774m", 36, 20, 1280, 774030080},
                        Want{"gpt2-1.5b", 48, 25, 1600, 1557611200}}) {
    Result<Gpt2Shape> s = parse_model(w.name);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_EQ(s->layers, w.layers);
    EXPECT_EQ(s->heads, w.heads);
    EXPECT_EQ(s->embd, w.embd);
    EXPECT_EQ(s->vocab, 50257);
    EXPECT_EQ(s->seq, 1024);
    EXPECT_EQ(s->param_count(), w.params) << w.name;
  }
  EXPECT_EQ(preset_names().size(), 4u);
}

TEST(Gpt2ShapeTest, UnitsCoverEveryParameterWithHfNames) {
  const Gpt2Shape s = parse_model("gpt2:layers=3,heads=2,embd=10,vocab=17,seq=5").value();
  const std::vector<zero::UnitSpec> units = unit_specs(s);
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(units[0].name, "wte");
  EXPECT_EQ(units[2].name, "h.1");
  EXPECT_EQ(units[4].name, "ln_f");
  std::uint64_t total = 0;
  for (const auto& u : units) {
    for (const auto& t : u.tensors) {
      total += std::accumulate(t.shape.begin(), t.shape.end(), std::uint64_t{1},
                               [](std::uint64_t a, std::int64_t d) { return a * static_cast<std::uint64_t>(d); });
    }
  }
  EXPECT_EQ(total, s.param_count());
  EXPECT_EQ(hf_tensor_name(units[0], units[0].tensors[1]), "wpe.weight");
  EXPECT_EQ(hf_tensor_name(units[2], units[2].tensors[2]), "h.1.attn.c_attn.weight");
  EXPECT_EQ(units[2].tensors[2].shape, (std::vector<std::int64_t>{10, 30}));  // Conv1D (in, out)
  EXPECT_EQ(units[2].tensors[10].name, "mlp.c_proj.weight");
  EXPECT_EQ(units[2].tensors[10].shape, (std::vector<std::int64_t>{40, 10}));
  EXPECT_EQ(hf_tensor_name(units[4], units[4].tensors[0]), "ln_f.weight");
}

TEST(Gpt2ShapeTest, CustomShapeInAnyOrder) {
  Result<Gpt2Shape> s = parse_model("gpt2:seq=256,vocab=256,embd=256,heads=4,layers=4");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->layers, 4);
  EXPECT_EQ(s->heads, 4);
  EXPECT_EQ(s->embd, 256);
  EXPECT_EQ(s->vocab, 256);
  EXPECT_EQ(s->seq, 256);
  EXPECT_EQ(s->head_dim(), 64);
}

TEST(Gpt2ShapeTest, MalformedShapesNameTheField) {
  struct Case {
    const char* spec;
    const char* must_contain;
  };
  for (const Case& c : {
           Case{"gpt2:layers=4,heads=3,embd=256,vocab=256,seq=256", "'embd' (256) must be divisible by field 'heads' (3)"},
           Case{"gpt2:layers=0,heads=4,embd=256,vocab=256,seq=256", "'layers'"},
           Case{"gpt2:layers=4,heads=0,embd=256,vocab=256,seq=256", "'heads'"},
           Case{"gpt2:layers=4,heads=4,embd=0,vocab=256,seq=256", "'embd'"},
           Case{"gpt2:layers=4,heads=4,embd=256,vocab=0,seq=256", "'vocab'"},
           Case{"gpt2:layers=4,heads=4,embd=256,vocab=256,seq=0", "'seq'"},
           Case{"gpt2:layers=-1,heads=4,embd=256,vocab=256,seq=256", "'layers'"},
           Case{"gpt2:layers=4,heads=4,embd=256,vocab=256", "'seq' is missing"},
           Case{"gpt2:layers=4,heads=4,embd=256,vocab=256,seq=256,layers=2", "'layers' given twice"},
           Case{"gpt2:layers=4,heads=4,embd=2x,vocab=256,seq=256", "'embd' must be a whole number"},
           Case{"gpt2:layers=4,heads=4,embd=,vocab=256,seq=256", "'embd' must be a whole number"},
           Case{"gpt2:layers=4,heads=4,width=256,vocab=256,seq=256", "unknown field 'width'"},
           Case{"gpt2:layers=4,heads", "'heads' is not key=value"},
           Case{"gpt2-7b", "unknown model"},
       }) {
    Result<Gpt2Shape> s = parse_model(c.spec);
    ASSERT_FALSE(s.is_ok()) << c.spec;
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.must_contain), std::string::npos)
        << c.spec << " -> " << s.status().message();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos);
  }
}

TEST(Gpt2ShapeTest, HfConfigRoundTripsTheShape) {
  const Gpt2Shape s = parse_model("gpt2:layers=3,heads=2,embd=10,vocab=17,seq=5").value();
  const nlohmann::json config = hf_config(s, DType::kF32);
  EXPECT_EQ(config["n_inner"], nullptr);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  Result<Gpt2Shape> back = shape_from_hf_config(config, "config.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->param_count(), s.param_count());
  EXPECT_EQ(back->heads, 2);
  nlohmann::json other = config;
  other["activation_function"] = "relu";
  EXPECT_NE(shape_from_hf_config(other, "c.json").status().message().find("activation_function"),
            std::string::npos);
  other = config;
  other.erase("n_embd");
  EXPECT_NE(shape_from_hf_config(other, "c.json").status().message().find("'n_embd' is missing"),
            std::string::npos);
  other = config;
  other["n_head"] = 3;
  EXPECT_NE(shape_from_hf_config(other, "c.json").status().message().find("divisible"),
            std::string::npos);
}

}  // namespace
}  // namespace tz::model
