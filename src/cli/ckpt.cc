// `tierzero ckpt info DIR` verifies a checkpoint (every checksum, streaming) and prints what it
// holds; `tierzero ckpt export DIR --out model.safetensors [--dtype bf16|fp32]` writes its fp32
// master weights with Hugging Face GPT-2 names and a config.json beside them (the counterpart of
// DeepSpeed's zero_to_fp32.py), one tensor in memory at a time; for the Llama family `--out` is a
// folder transformers loads (config.json, shards above 5 GB with an index, the source folder's
// tokenizer files).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/safetensors.h"
#include "model/factory.h"
#include "core/output_file.h"
#include "model/hf.h"
#include "model/hf_folder.h"
#include "zero/checkpoint.h"

namespace tz::cli {
namespace {

int fail(const Status& st) { return report_failure("ckpt info", st); }

int run_info(const std::string& path, bool json) {
  auto dir = zero::resolve_checkpoint(path);
  if (!dir.is_ok()) return fail(dir.status());
  auto summary = zero::verify_checkpoint(*dir);
  if (!summary.is_ok()) return fail(summary.status());
  const nlohmann::json& m = summary->manifest;
  if (json) {
    nlohmann::ordered_json out = {{"path", *dir},
                                  {"step", m["step"]},
                                  {"model", m["model"]},
                                  {"stage", m["stage"]},
                                  {"ranks", m["ranks"]},
                                  {"compute_dtype", m["compute_dtype"]},
                                  {"optimizer_states", m["optimizer_states"]},
                                  {"tensors", summary->tensors},
                                  {"params", summary->params},
                                  {"bytes", summary->bytes},
                                  {"checksums_verified", true}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("checkpoint   %s\n", dir->c_str());
  std::printf("step         %s\n", m["step"].dump().c_str());
  std::printf("model        %s\n", m["model"].dump().c_str());
  std::printf("saved with   stage %s, %s ranks, %s compute, %s optimizer states per parameter\n",
              m["stage"].dump().c_str(), m["ranks"].dump().c_str(),
              m.value("compute_dtype", "?").c_str(), m["optimizer_states"].dump().c_str());
  std::printf("tensors      %llu (%llu parameters, %.1f MiB in %zu files)\n",
              static_cast<unsigned long long>(summary->tensors),
              static_cast<unsigned long long>(summary->params),
              static_cast<double>(summary->bytes) / (1 << 20), m["files"].size());
  std::printf("checksums    all %llu verified (xxh3)\n",
              static_cast<unsigned long long>(summary->tensors * m["files"].size()));
  return 0;
}

// One master tensor read as fp32 and checked against the manifest's checksum (of the fp32 values
// read, before any rounding).
Status read_verified(const SafetensorsReader& master, const SafetensorsEntry& entry,
                     const std::string& checksum, std::span<float> values) {
  TZ_RETURN_IF_ERROR(master.read_f32(entry, values));
  if (zero::tensor_checksum(values) != checksum) {
    return Status::corrupt(tensor_context(master.path(), entry.name) +
                           " does not match its checksum");
  }
  return Status::ok();
}

// The Llama family's tensors carry their HF names: a folder, as Llama::save_weights writes. A
// tensor split into vocabulary chunks is its units' same-named tensors in unit order
// (model::hf_tensors): their rows joined.
Status export_llama_folder(const nlohmann::json& manifest, const SafetensorsReader& master,
                           const model::LlamaConfig& llama, const model::ModelDesc& desc,
                           const std::string& out, DType dtype) {
  std::vector<model::FolderTensor> tensors;
  struct Part {
    const SafetensorsEntry* entry;
    std::string checksum;
  };
  std::vector<std::vector<Part>> parts;
  std::map<std::string, std::size_t> index;
  for (const nlohmann::json& t : manifest["tensors"]) {
    const std::string key = t.value("name", "");
    const SafetensorsEntry* e = master.find(key);
    if (e == nullptr) return Status::not_found(tensor_context(master.path(), key) + " is missing");
    const std::string hf = t.value("tensor", "");
    const auto [it, added] = index.emplace(hf, tensors.size());
    if (added) {
      tensors.push_back({hf, e->shape});
      parts.emplace_back();
    } else {
      std::vector<std::int64_t>& shape = tensors[it->second].shape;
      if (e->shape.empty() || shape.size() != e->shape.size() ||
          !std::equal(shape.begin() + 1, shape.end(), e->shape.begin() + 1)) {
        return Status::corrupt(tensor_context(master.path(), key) + " is a part of '" + hf +
                               "' whose shape does not match the others'");
      }
      shape[0] += e->shape[0];
    }
    parts[it->second].push_back({e, t["xxh3"].value("master.safetensors", "")});
  }
  Status written = model::write_hf_folder(
      true, tensors,
      [&](std::size_t i, std::span<float> values) -> Status {
        std::size_t at = 0;
        for (const Part& p : parts[i]) {
          TZ_RETURN_IF_ERROR(
              read_verified(master, *p.entry, p.checksum, values.subspan(at, p.entry->numel())));
          at += p.entry->numel();
        }
        return Status::ok();
      },
      out, model::llama_hf_config(llama, dtype), dtype, desc.folder);
  TZ_RETURN_IF_ERROR(std::move(written));
  std::printf("exported %zu tensors of %s (step %s) to the folder %s\n", tensors.size(),
              manifest["model"].value("name", "").c_str(), manifest["step"].dump().c_str(), out.c_str());
  return Status::ok();
}

// GPT-2: one safetensors file with HF's names and its config.json beside it.
Status export_gpt2_file(const nlohmann::json& manifest, const SafetensorsReader& master,
                        const model::Gpt2Shape& shape, const std::string& model_name,
                        const std::string& out, DType dtype) {
  std::vector<SafetensorsTensorSpec> specs;
  struct Item {
    const SafetensorsEntry* entry;
    std::string hf_name;
    std::string checksum;
  };
  std::vector<Item> plan;
  for (const nlohmann::json& t : manifest["tensors"]) {
    const std::string key = t.value("name", "");
    const SafetensorsEntry* e = master.find(key);
    if (e == nullptr) return Status::not_found(tensor_context(master.path(), key) + " is missing");
    zero::UnitSpec unit;
    unit.name = t.value("unit", "");
    zero::TensorSpec tensor{t.value("tensor", ""), e->shape};
    const std::string hf = std::string(model::kHfPrefix) + model::hf_tensor_name(unit, tensor);
    specs.push_back({hf, dtype, e->shape});
    plan.push_back({e, hf, t["xxh3"].value("master.safetensors", "")});
  }
  TZ_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                      SafetensorsWriter::create(out, specs, {{"format", "pt"}}));
  std::vector<float> values;
  for (const Item& item : plan) {
    values.resize(item.entry->numel());
    TZ_RETURN_IF_ERROR(read_verified(master, *item.entry, item.checksum, values));
    TZ_RETURN_IF_ERROR(writer.write_f32(item.hf_name, values));
  }
  TZ_RETURN_IF_ERROR(writer.finish());
  const std::string config_path = model::hf_config_path(out);
  TZ_RETURN_IF_ERROR(
      write_output_file("", config_path, model::hf_config(shape, dtype).dump(2) + "\n"));
  std::printf("exported %zu tensors of %s (step %s) to %s and %s\n", plan.size(),
              model_name.c_str(), manifest["step"].dump().c_str(), out.c_str(),
              config_path.c_str());
  return Status::ok();
}

Status export_weights(const std::string& path, const std::string& out, DType dtype) {
  TZ_ASSIGN_OR_RETURN(std::string dir, zero::resolve_checkpoint(path));
  TZ_ASSIGN_OR_RETURN(nlohmann::json manifest, zero::read_manifest(dir));
  const std::string model_name = manifest["model"].value("name", "");
  if (model_name.empty()) {
    return Status::invalid_argument(dir + "/manifest.json: names no model (model.name), so the " +
                                    "tensors cannot be given Hugging Face names");
  }
  TZ_ASSIGN_OR_RETURN(const model::ModelDesc desc, model::resolve_model(model_name));
  TZ_ASSIGN_OR_RETURN(SafetensorsReader master,
                      SafetensorsReader::open(dir + "/master.safetensors"));
  if (const auto* llama = std::get_if<model::LlamaConfig>(&desc.arch)) {
    return export_llama_folder(manifest, master, *llama, desc, out, dtype);
  }
  return export_gpt2_file(manifest, master, std::get<model::Gpt2Shape>(desc.arch), model_name,
                          out, dtype);
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* ckpt = tree.group("ckpt", "Inspect, verify and export training checkpoints");

  struct InfoOptions {
    std::string path;
    bool json = false;
  };
  auto info_opts = std::make_shared<InfoOptions>();
  CLI::App* info = ckpt->add_subcommand(
      "info", "Verify every checksum of a checkpoint and print its step, model, stage, ranks and "
              "sizes (exit 1 naming the file and tensor on any mismatch)");
  info->add_option("dir", info_opts->path,
                   "A checkpoint (DIR/step-000120) or a directory of them (its latest)")
      ->required();
  info->add_flag("--json", info_opts->json, "One JSON object");
  info->callback([info_opts] { exit_code() = run_info(info_opts->path, info_opts->json); });

  struct ExportOptions {
    std::string path;
    std::string out;
    std::string dtype = "fp32";
  };
  auto export_opts = std::make_shared<ExportOptions>();
  CLI::App* exp = ckpt->add_subcommand(
      "export", "Write a checkpoint's master weights as Hugging Face safetensors plus config.json "
                "(GPT-2: a file; the Llama family: a folder; loadable by "
                "transformers' from_pretrained)");
  exp->add_option("dir", export_opts->path, "A checkpoint or a directory of them (its latest)")
      ->required();
  exp->add_option("--out", export_opts->out,
                  "Output .safetensors file (GPT-2) or folder (the Llama family)")
      ->required();
  exp->add_option("--dtype", export_opts->dtype, "fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  exp->callback([export_opts] {
    const DType dtype = export_opts->dtype == "bf16" ? DType::kBF16 : DType::kF32;
    const Status st = export_weights(export_opts->path, export_opts->out, dtype);
    exit_code() = st.is_ok() ? 0 : report_failure("ckpt export", st);
  });
});

}  // namespace
}  // namespace tz::cli
