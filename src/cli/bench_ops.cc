// `tierzero bench ops`: times every kernel of ops/ops.h, forward and backward, on GPT-2-small's
// shapes (by default batch 4 x seq 256 = 1024 rows, embd 768, 12 heads, vocab 50257) on the chosen
// device, and reports the matmuls' and attention's GFLOP/s next to the backend's own GEMM alone on
// the same shape, measured in the same run right after each matmul (the ceiling: OpenBLAS sgemm on
// the CPU, cublasGemmEx on CUDA). Element-wise ops report GB/s of the tensors they read and write.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/dtype.h"
#include "gpu/select.h"
#include "ops/gemm.h"
#include "ops/ops.h"

namespace tz::cli {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct OpsBenchOptions {
  std::string device = "auto";
  int batch = 4;
  int seq = 256;
  int embd = 768;
  int heads = 12;
  int vocab = 50257;
  std::string dtype = "fp32";
  std::string param_dtype;  // empty: as --dtype
  int threads = 0;
  int repeat = 3;
  bool json = false;
};

struct BenchCase {
  std::string op;
  std::string pass;   // "fwd" or "bwd"
  std::string shape;  // human-readable
  double flops = 0;   // 0 for element-wise ops
  double bytes = 0;   // tensor bytes read + written (element-wise ops)
  std::function<Status()> run;
  // The ceiling's GEMM shape (row-major (m, k) x (k, n)); m == 0 when none.
  std::int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
};

struct BenchResult {
  BenchCase c;
  double median_s = 0, min_s = 0, max_s = 0;
  double peak_gflops = 0;  // same-shape GEMM alone, this run
};

// All buffers of one GPT-2 block plus embeddings and head, allocated once.
class Buffers {
 public:
  explicit Buffers(gpu::Device& device) : device_(device) {}
  Result<ops::Tensor> tensor(std::size_t n, DType dt, float value) {
    TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, device_.allocate(std::max<std::size_t>(n, 1) * dtype_size(dt)));
    TZ_RETURN_IF_ERROR(device_.fill(b.data(), dt, n, value, device_.compute_stream()));
    owned_.push_back(std::move(b));
    return ops::Tensor{owned_.back().data(), dt};
  }
  Result<float*> f32(std::size_t n) {
    TZ_ASSIGN_OR_RETURN(ops::Tensor t, tensor(n, DType::kF32, 1.0f));
    return static_cast<float*>(t.data);
  }
  Result<std::int32_t*> tokens(std::size_t n, int vocab) {
    std::vector<std::int32_t> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(vocab));
    TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, device_.allocate(n * 4));
    TZ_RETURN_IF_ERROR(device_.copy_async(b.data(), host.data(), n * 4, gpu::CopyKind::kHostToDevice,
                                          device_.compute_stream()));
    TZ_RETURN_IF_ERROR(device_.compute_stream().synchronize());
    owned_.push_back(std::move(b));
    return static_cast<std::int32_t*>(owned_.back().data());
  }

 private:
  gpu::Device& device_;
  std::vector<gpu::DeviceBuffer> owned_;
};

// The block's four matmuls and the tied head (its weight is the embedding's, `wte`).
Status add_matmul_cases(ops::Ops& o, Buffers& buf, DType act, DType param, std::int64_t rows,
                        std::int64_t c, std::int64_t v, const ops::Tensor& wte,
                        const ops::Tensor& dwte, gpu::Stream& s, std::vector<BenchCase>& cases) {
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  struct Mm {
    const char* name;
    std::int64_t in, out;
    ops::WeightLayout layout;
    bool bias;
  };
  for (const Mm& m : {Mm{"matmul c_attn", c, 3 * c, ops::WeightLayout::kInOut, true},
                      Mm{"matmul attn.c_proj", c, c, ops::WeightLayout::kInOut, true},
                      Mm{"matmul c_fc", c, 4 * c, ops::WeightLayout::kInOut, true},
                      Mm{"matmul mlp.c_proj", 4 * c, c, ops::WeightLayout::kInOut, true},
                      Mm{"matmul lm_head", c, v, ops::WeightLayout::kOutIn, false}}) {
    TZ_ASSIGN_OR_RETURN(ops::Tensor in, buf.tensor(n(rows * m.in), act, 0.5f));
    TZ_ASSIGN_OR_RETURN(ops::Tensor out, buf.tensor(n(rows * m.out), act, 0.0f));
    TZ_ASSIGN_OR_RETURN(ops::Tensor gout, buf.tensor(n(rows * m.out), act, 0.01f));
    TZ_ASSIGN_OR_RETURN(ops::Tensor gin, buf.tensor(n(rows * m.in), act, 0.0f));
    ops::Tensor w = wte;
    ops::Tensor dw = dwte;
    if (m.layout == ops::WeightLayout::kInOut) {
      TZ_ASSIGN_OR_RETURN(w, buf.tensor(n(m.in * m.out), param, 0.01f));
      TZ_ASSIGN_OR_RETURN(dw, buf.tensor(n(m.in * m.out), param, 0.0f));
    }
    ops::Tensor bias{nullptr, param};
    ops::Tensor dbias{nullptr, param};
    if (m.bias) {
      TZ_ASSIGN_OR_RETURN(bias, buf.tensor(n(m.out), param, 0.0f));
      TZ_ASSIGN_OR_RETURN(dbias, buf.tensor(n(m.out), param, 0.0f));
    }
    const std::string shape =
        std::to_string(rows) + "x" + std::to_string(m.in) + "->" + std::to_string(m.out);
    const double f = 2.0 * static_cast<double>(rows) * static_cast<double>(m.in) * static_cast<double>(m.out);
    const ops::WeightLayout layout = m.layout;
    const std::int64_t in_dim = m.in, out_dim = m.out;
    BenchCase fwd{m.name, "fwd", shape, f, 0, [&o, out, in, w, layout, bias, rows, in_dim, out_dim, &s] {
                    return o.matmul_forward(out, in, w, layout, bias, rows, in_dim, out_dim, s);
                  }};
    fwd.gemm_m = rows;
    fwd.gemm_n = m.out;
    fwd.gemm_k = m.in;
    BenchCase bwd{m.name, "bwd", shape, 2 * f, 0,
                  [&o, gin, dw, dbias, gout, in, w, layout, rows, in_dim, out_dim, &s] {
                    return o.matmul_backward(gin, ops::Accumulate::kOverwrite, dw, dbias, gout, in,
                                             w, layout, rows, in_dim, out_dim, s);
                  }};
    bwd.gemm_m = rows;
    bwd.gemm_n = m.out;
    bwd.gemm_k = m.in;
    cases.push_back(fwd);
    cases.push_back(bwd);
  }

  return Status::ok();
}

// GELU over the MLP's hidden rows, the residual add, and the cross-entropy over the logits.
Status add_elementwise_cases(ops::Ops& o, Buffers& buf, DType act, std::int64_t rows,
                             std::int64_t c, std::int64_t v, std::int32_t* tok, ops::Tensor x,
                             ops::Tensor y, ops::Tensor dx, ops::Tensor dy, gpu::Stream& s,
                             std::vector<BenchCase>& cases) {
  const auto n = [](std::int64_t z) { return static_cast<std::size_t>(z); };
  const double ea = static_cast<double>(dtype_size(act));
  TZ_ASSIGN_OR_RETURN(ops::Tensor hid, buf.tensor(n(rows * 4 * c), act, 0.5f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor hout, buf.tensor(n(rows * 4 * c), act, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor hgrad, buf.tensor(n(rows * 4 * c), act, 0.01f));
  const std::int64_t nh = rows * 4 * c;
  const std::string hshape = std::to_string(rows) + "x" + std::to_string(4 * c);
  cases.push_back({"gelu", "fwd", hshape, 0, 2 * nh * ea,
                   [&o, hout, hid, nh, &s] { return o.gelu_forward(hout, hid, nh, s); }});
  cases.push_back({"gelu", "bwd", hshape, 0, 3 * nh * ea, [&o, hout, hgrad, hid, nh, &s] {
                     return o.gelu_backward(hout, ops::Accumulate::kOverwrite, hgrad, hid, nh, s);
                   }});
  const std::int64_t nr = rows * c;
  const std::string rshape = std::to_string(rows) + "x" + std::to_string(c);
  cases.push_back({"residual", "fwd", rshape, 0, 3 * nr * ea,
                   [&o, y, x, dy, nr, &s] { return o.residual_forward(y, x, dy, nr, s); }});
  cases.push_back({"residual", "bwd", rshape, 0, 3 * nr * ea, [&o, dx, dy, nr, &s] {
                     return o.residual_backward(dx, ops::Accumulate::kAdd, ops::Tensor{},
                                                ops::Accumulate::kOverwrite, dy, nr, s);
                   }});

  TZ_ASSIGN_OR_RETURN(ops::Tensor logits, buf.tensor(n(rows * v), act, 0.0f));
  TZ_ASSIGN_OR_RETURN(float* losses, buf.f32(n(rows)));
  const std::string cshape = std::to_string(rows) + "x" + std::to_string(v);
  cases.push_back({"cross_entropy", "fwd", cshape, 0, rows * v * ea,
                   [&o, losses, logits, tok, rows, v, &s] {
                     return o.cross_entropy_forward(losses, logits, tok, rows, v, s);
                   }});
  // In place over the logits, losses in the same pass: the path the model takes.
  cases.push_back({"cross_entropy", "bwd", cshape, 0, 2 * rows * v * ea,
                   [&o, losses, logits, tok, rows, v, &s] {
                     return o.cross_entropy_backward(logits, losses, logits, tok, rows, v,
                                                     1.0f / static_cast<float>(rows), s);
                   }});
  return Status::ok();
}

Result<std::vector<BenchCase>> build_cases(ops::Ops& o, Buffers& buf, const OpsBenchOptions& opt,
                                           DType act, DType param, gpu::Stream& s) {
  const std::int64_t b = opt.batch, t = opt.seq, c = opt.embd, h = opt.heads, v = opt.vocab;
  const std::int64_t rows = b * t;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  const double ea = static_cast<double>(dtype_size(act));
  const double ep = static_cast<double>(dtype_size(param));
  std::vector<BenchCase> cases;

  TZ_ASSIGN_OR_RETURN(std::int32_t* tok, buf.tokens(n(rows), opt.vocab));
  TZ_ASSIGN_OR_RETURN(ops::Tensor wte, buf.tensor(n(v * c), param, 0.01f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor wpe, buf.tensor(n(t * c), param, 0.01f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dwte, buf.tensor(n(v * c), param, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dwpe, buf.tensor(n(t * c), param, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor x, buf.tensor(n(rows * c), act, 0.5f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor y, buf.tensor(n(rows * c), act, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dx, buf.tensor(n(rows * c), act, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dy, buf.tensor(n(rows * c), act, 0.01f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor lnw, buf.tensor(n(c), param, 1.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor lnb, buf.tensor(n(c), param, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dlnw, buf.tensor(n(c), param, 0.0f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dlnb, buf.tensor(n(c), param, 0.0f));
  TZ_ASSIGN_OR_RETURN(float* mean, buf.f32(n(rows)));
  TZ_ASSIGN_OR_RETURN(float* rstd, buf.f32(n(rows)));

  cases.push_back({"embedding", "fwd", std::to_string(rows) + "x" + std::to_string(c), 0,
                   rows * c * (ea + 2 * ep), [&o, x, tok, wte, wpe, b, t, c, v, &s] {
                     return o.embedding_forward(x, tok, wte, wpe, b, t, c, v, s);
                   }});
  cases.push_back({"embedding", "bwd", std::to_string(rows) + "x" + std::to_string(c), 0,
                   rows * c * (ea + 4 * ep), [&o, dwte, dwpe, dy, tok, b, t, c, v, &s] {
                     return o.embedding_backward(dwte, dwpe, dy, tok, b, t, c, v, s);
                   }});
  cases.push_back({"layernorm", "fwd", std::to_string(rows) + "x" + std::to_string(c), 0,
                   2 * rows * c * ea, [&o, y, mean, rstd, x, lnw, lnb, rows, c, &s] {
                     return o.layernorm_forward(y, mean, rstd, x, lnw, lnb, rows, c, s);
                   }});
  cases.push_back({"layernorm", "bwd", std::to_string(rows) + "x" + std::to_string(c), 0,
                   3 * rows * c * ea, [&o, dx, dlnw, dlnb, dy, x, lnw, mean, rstd, rows, c, &s] {
                     return o.layernorm_backward(dx, ops::Accumulate::kAdd, dlnw, dlnb, dy, x, lnw,
                                                 mean, rstd, rows, c, s);
                   }});

  TZ_RETURN_IF_ERROR(add_matmul_cases(o, buf, act, param, rows, c, v, wte, dwte, s, cases));

  TZ_ASSIGN_OR_RETURN(ops::Tensor qkv, buf.tensor(n(rows * 3 * c), act, 0.1f));
  TZ_ASSIGN_OR_RETURN(ops::Tensor dqkv, buf.tensor(n(rows * 3 * c), act, 0.0f));
  TZ_ASSIGN_OR_RETURN(float* lse, buf.f32(n(b * h * t)));
  TZ_ASSIGN_OR_RETURN(float* delta, buf.f32(n(b * h * t)));
  // Causal attention: QK^T and PV over the lower triangle, 2 * 2 * B * C * T(T+1)/2 flops;
  // backward recomputes QK^T and adds dV, dP, dQ, dK: 2.5x the forward.
  const double attn_f = 2.0 * static_cast<double>(b * c) * static_cast<double>(t) * static_cast<double>(t + 1);
  const std::string attn_shape = "B" + std::to_string(b) + " T" + std::to_string(t) + " C" +
                                 std::to_string(c) + " H" + std::to_string(h);
  cases.push_back({"attention", "fwd", attn_shape, attn_f, 0, [&o, y, lse, qkv, b, t, c, h, &s] {
                     return o.attention_forward(y, lse, qkv, b, t, c, h, s);
                   }});
  cases.push_back({"attention", "bwd", attn_shape, 2.5 * attn_f, 0,
                   [&o, dqkv, delta, dy, qkv, y, lse, b, t, c, h, &s] {
                     return o.attention_backward(dqkv, ops::Accumulate::kOverwrite, delta, dy, qkv,
                                                 y, lse, b, t, c, h, s);
                   }});

  TZ_RETURN_IF_ERROR(add_elementwise_cases(o, buf, act, rows, c, v, tok, x, y, dx, dy, s, cases));
  return cases;
}

int fail(const Status& st) { return report_failure("bench ops", st); }

// The dtypes the options name.
struct OpsDtypes {
  DType act = DType::kF32;
  DType param = DType::kF32;
};

Result<OpsDtypes> parse(const OpsBenchOptions& opt) {
  const auto act = parse_dtype(opt.dtype);
  const auto param = parse_dtype(opt.param_dtype.empty() ? opt.dtype : opt.param_dtype);
  if (!act || !param) {
    return Status::invalid_argument("--dtype/--param-dtype accept fp32, bf16, fp16");
  }
  if (opt.embd % opt.heads != 0) {
    return Status::invalid_argument("--embd " + std::to_string(opt.embd) +
                                    " does not divide by --heads " + std::to_string(opt.heads));
  }
  return OpsDtypes{*act, *param};
}

// Every case, timed after a warm-up, and the same-shape GEMM alone after each matmul.
Result<std::vector<BenchResult>> measure(const OpsBenchOptions& opt, const OpsDtypes& d,
                                         gpu::Device& dev, ops::Ops& o) {
  gpu::Stream& s = dev.compute_stream();
  std::vector<BenchResult> results;
  Buffers buf(dev);
  TZ_ASSIGN_OR_RETURN(std::vector<BenchCase> cases, build_cases(o, buf, opt, d.act, d.param, s));
  TZ_RETURN_IF_ERROR(s.synchronize());
  for (const BenchCase& c : cases) {
    std::vector<double> times;
    for (int rep = -1; rep < opt.repeat; ++rep) {  // rep -1 is the warm-up
      const auto t0 = Clock::now();
      TZ_RETURN_IF_ERROR(c.run());
      TZ_RETURN_IF_ERROR(s.synchronize());
      const std::chrono::duration<double> dt = Clock::now() - t0;
      if (rep >= 0) times.push_back(dt.count());
    }
    BenchResult r{c, median(times), *std::min_element(times.begin(), times.end()),
                  *std::max_element(times.begin(), times.end()), 0};
    if (c.gemm_m > 0) {
      TZ_ASSIGN_OR_RETURN(double g, o.gemm_seconds(c.gemm_m, c.gemm_n, c.gemm_k, d.act,
                                                   opt.repeat, s));
      r.peak_gflops = 2.0 * static_cast<double>(c.gemm_m) * static_cast<double>(c.gemm_n) *
                      static_cast<double>(c.gemm_k) / g / 1e9;
    }
    results.push_back(r);
  }
  TZ_RETURN_IF_ERROR(dev.synchronize());
  return results;
}

void report(const OpsBenchOptions& opt, const OpsDtypes& d, const std::string& backend,
            const std::vector<BenchResult>& results) {
  // The CPU GEMM's library, kernel target and quick sgemm against the FMA peak (as `info` prints).
  const std::string gemm_line =
      backend.rfind("cpu", 0) == 0 ? ops::gemm_report_line(ops::cpu_gemm_report(opt.threads, true))
                                   : std::string();
  BenchReport out(opt.json);
  out.text(cell("bench ops: %s, act %s, param %s, median of %d", backend.c_str(),
                std::string(dtype_name(d.act)).c_str(), std::string(dtype_name(d.param)).c_str(),
                opt.repeat));
  if (!gemm_line.empty()) out.text(gemm_line);
  out.table({{"op", 20, true},
             {"pass", 4, true},
             {"shape", 22, true},
             {"median ms", 10},
             {"GFLOP/s", 9},
             {"GB/s", 8},
             {"GEMM pk", 9},
             {"of pk", 7}});
  for (const BenchResult& r : results) {
    const double gf = r.c.flops > 0 ? r.c.flops / r.median_s / 1e9 : 0;
    const double gb = r.c.bytes > 0 ? r.c.bytes / r.median_s / 1e9 : 0;
    json j;
    j["bench"] = "ops";
    j["backend"] = backend;
    j["op"] = r.c.op;
    j["pass"] = r.c.pass;
    j["shape"] = r.c.shape;
    j["act_dtype"] = dtype_name(d.act);
    j["param_dtype"] = dtype_name(d.param);
    j["repeats"] = opt.repeat;
    j["median_ms"] = r.median_s * 1e3;
    j["min_ms"] = r.min_s * 1e3;
    j["max_ms"] = r.max_s * 1e3;
    if (r.c.flops > 0) j["gflops"] = gf;
    if (r.c.bytes > 0) j["gbps"] = gb;
    if (r.peak_gflops > 0) {
      j["peer"] = "backend GEMM alone, same shape, same run";
      j["peak_gflops"] = r.peak_gflops;
      j["fraction_of_peak"] = gf / r.peak_gflops;
    }
    j["machine"] = machine_json();
    if (!gemm_line.empty()) j["gemm"] = gemm_line;
    out.result(j, {r.c.op, r.c.pass, r.c.shape, cell("%.3f", r.median_s * 1e3), cell("%.1f", gf),
                   cell("%.2f", gb), cell("%.1f", r.peak_gflops),
                   cell("%.2f", r.peak_gflops > 0 ? gf / r.peak_gflops : 0.0)});
  }
}

// parse -> build (device, backend) -> measure -> report.
int run(const OpsBenchOptions& opt) {
  Result<OpsDtypes> d = parse(opt);
  if (!d.is_ok()) return fail(d.status());
  gpu::DeviceOptions dopts;
  Result<gpu::DeviceChoice> choice = gpu::parse_device_choice(opt.device);
  if (!choice.is_ok()) return fail(choice.status());
  dopts.choice = *choice;
  auto device = gpu::open_device(dopts);
  if (!device.is_ok()) return fail(device.status());
  auto o = ops::Ops::create(**device, ops::OpsOptions{opt.threads});
  if (!o.is_ok()) return fail(o.status());
  Result<std::vector<BenchResult>> results = measure(opt, *d, **device, **o);
  if (!results.is_ok()) return fail(results.status());
  report(opt, *d, std::string((*o)->name()), *results);
  return 0;
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "ops", "Kernel times (forward and backward) on GPT-2-small's shapes vs the same-run GEMM");
  auto opts = std::make_shared<OpsBenchOptions>();
  cmd->add_option("--device", opts->device, "auto, host or cuda (auto honours TZ_DEVICE)")
      ->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Sequences per micro-batch")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--seq", opts->seq, "Sequence length")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--embd", opts->embd, "Embedding width")->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--heads", opts->heads, "Attention heads")->check(CLI::Range(1, 1 << 12))
      ->capture_default_str();
  cmd->add_option("--vocab", opts->vocab, "Vocabulary size")->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "Activation storage: fp32, bf16, fp16")
      ->capture_default_str();
  cmd->add_option("--param-dtype", opts->param_dtype,
                  "Parameter storage (default: as --dtype; CUDA needs the same)");
  cmd->add_option("--threads", opts->threads, "CPU backend threads (0: every core)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("--repeat", opts->repeat, "Timed repeats per kernel (median reported)")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_flag("--json", opts->json, "One JSON object per result");
  cmd->callback([opts] { exit_code() = run(*opts); });
});

}  // namespace tz::cli
