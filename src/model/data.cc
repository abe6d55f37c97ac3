// Token files, text-as-bytes corpora and the data loader (data.h): every check on a file happens
// when it is loaded, so a bad corpus stops a run before its first step.
#include "model/data.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>
#include <utility>

namespace tz::model {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Reads the whole file; errno errors name it.
Result<std::vector<unsigned char>> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::from_errno(errno, "open data file", path);
  std::vector<unsigned char> bytes;
  unsigned char buf[1 << 16];
  for (;;) {
    const std::size_t n = std::fread(buf, 1, sizeof(buf), f);
    bytes.insert(bytes.end(), buf, buf + n);
    if (n < sizeof(buf)) break;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) return Status::from_errno(err, "read data file", path);
  return bytes;
}

std::int32_t read_le_i32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  std::int32_t out = 0;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

void write_le_i32(unsigned char* p, std::int32_t value) {
  std::uint32_t v = 0;
  std::memcpy(&v, &value, sizeof(v));
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

Status bad_token(const std::string& path, std::size_t index, std::uint64_t value,
                 std::int64_t vocab) {
  return Status::invalid_argument(path + ": token " + std::to_string(value) + " at position " +
                                  std::to_string(index) + " is >= the model's vocab " +
                                  std::to_string(vocab) +
                                  " (a corpus tokenized for another model?)");
}

Result<TokenData> parse_token_file(const std::string& path, const std::vector<unsigned char>& bytes,
                                   std::int64_t vocab) {
  if (bytes.size() < kTokenFileHeaderBytes) {
    return Status::corrupt(path + ": " + std::to_string(bytes.size()) +
                           " bytes, shorter than the 1024-byte header of an llm.c token file");
  }
  const std::int32_t magic = read_le_i32(bytes.data());
  const std::int32_t version = read_le_i32(bytes.data() + 4);
  const std::int32_t count = read_le_i32(bytes.data() + 8);
  if (magic != kTokenFileMagic) {
    return Status::corrupt(path + ": wrong magic " + std::to_string(magic) +
                           " (an llm.c token file has " + std::to_string(kTokenFileMagic) +
                           "; plain text files must not end in .bin)");
  }
  if (version != kTokenFileVersion && version != kTokenFileVersionU32) {
    return Status::corrupt(path + ": unsupported token file version " + std::to_string(version) +
                           " (version 1 holds uint16 tokens, version 2 uint32)");
  }
  if (count < 0) {
    return Status::corrupt(path + ": negative token count " + std::to_string(count) +
                           " in the header");
  }
  const std::uint64_t width = version == kTokenFileVersion ? 2 : 4;
  const std::uint64_t expected = kTokenFileHeaderBytes + width * static_cast<std::uint64_t>(count);
  if (bytes.size() != expected) {
    return Status::corrupt(path + ": file is " + std::to_string(bytes.size()) +
                           " bytes but its version " + std::to_string(version) +
                           " header says " + std::to_string(count) + " tokens (" +
                           std::to_string(expected) +
                           " bytes); truncated or not written by a token writer");
  }
  TokenData data;
  data.path = path;
  data.version = version;
  data.tokens.resize(static_cast<std::size_t>(count));
  const unsigned char* p = bytes.data() + kTokenFileHeaderBytes;
  for (std::size_t i = 0; i < data.tokens.size(); ++i) {
    std::uint32_t v = 0;
    for (std::uint64_t k = width; k-- > 0;) v = (v << 8) | p[width * i + k];
    if (v >= static_cast<std::uint64_t>(vocab)) return bad_token(path, i, v, vocab);
    data.tokens[i] = v;
  }
  return data;
}

Status check_count(const std::string& path, std::uint64_t count) {
  if (count > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    return Status::invalid_argument(
        path + ": " + std::to_string(count) +
        " tokens do not fit the header's int32 count; split the corpus");
  }
  return Status::ok();
}

}  // namespace

Result<TokenData> load_tokens(const std::string& path, std::int64_t vocab) {
  TZ_ASSERT(vocab > 0 && vocab <= std::numeric_limits<std::int32_t>::max(),
            "vocab out of the token range");
  TZ_ASSIGN_OR_RETURN(std::vector<unsigned char> bytes, read_file(path));
  if (bytes.empty()) return Status::invalid_argument(path + ": empty data file");
  const bool token_file = ends_with(path, ".bin") ||
                          (bytes.size() >= 4 && read_le_i32(bytes.data()) == kTokenFileMagic);
  if (token_file) return parse_token_file(path, bytes, vocab);
  TokenData data;
  data.path = path;
  data.byte_level = true;
  data.tokens.resize(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] >= vocab) return bad_token(path, i, bytes[i], vocab);
    data.tokens[i] = bytes[i];
  }
  return data;
}

TokenData synthetic_tokens(std::uint64_t count, std::int64_t vocab, std::uint64_t seed) {
  TZ_ASSERT(vocab > 0, "synthetic tokens need a vocabulary");
  TokenData d;
  d.path = "<synthetic>";
  d.tokens.resize(count);
  std::mt19937_64 gen(seed);
  // Every id of the vocabulary (a 128k vocabulary's ids do not fit 16 bits).
  for (auto& t : d.tokens) t = static_cast<std::uint32_t>(gen() % static_cast<std::uint64_t>(vocab));
  return d;
}

Result<TokenFileWriter> TokenFileWriter::create(const std::string& path, std::int32_t version,
                                                const std::vector<std::string>& inputs) {
  TZ_ASSERT(version == kTokenFileVersion || version == kTokenFileVersionU32, "token file version");
  TZ_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create("", path, inputs));
  const std::vector<std::byte> header(kTokenFileHeaderBytes, std::byte{0});
  TZ_RETURN_IF_ERROR(out.write(header));
  return TokenFileWriter(std::move(out), version);
}

Status TokenFileWriter::append(std::span<const std::uint32_t> tokens) {
  TZ_RETURN_IF_ERROR(check_count(out_.path(), count_ + tokens.size()));
  const std::size_t width = version_ == kTokenFileVersion ? 2 : 4;
  buffer_.resize(tokens.size() * width);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::uint32_t t = tokens[i];
    if (width == 2 && t > 0xffff) {
      return Status::invalid_argument(out_.path() + ": token " + std::to_string(t) + " at position " +
                                      std::to_string(count_ + i) +
                                      " does not fit a version 1 (uint16) token file");
    }
    for (std::size_t k = 0; k < width; ++k) {
      buffer_[width * i + k] = static_cast<unsigned char>(t >> (8 * k));
    }
  }
  TZ_RETURN_IF_ERROR(out_.write(std::as_bytes(std::span<const unsigned char>(buffer_))));
  count_ += tokens.size();
  return Status::ok();
}

Status TokenFileWriter::finish() {
  unsigned char header[12];
  write_le_i32(header, kTokenFileMagic);
  write_le_i32(header + 4, version_);
  write_le_i32(header + 8, static_cast<std::int32_t>(count_));
  TZ_RETURN_IF_ERROR(out_.write_at(0, std::as_bytes(std::span<const unsigned char>(header))));
  return out_.commit();
}

Status write_token_file(const std::string& path, std::span<const std::uint32_t> tokens,
                        std::int32_t version, const std::vector<std::string>& inputs) {
  TZ_RETURN_IF_ERROR(check_count(path, tokens.size()));
  if (version == 0) {
    std::uint32_t max_token = 0;
    for (std::uint32_t t : tokens) max_token = std::max(max_token, t);
    version = max_token <= 0xffff ? kTokenFileVersion : kTokenFileVersionU32;
  }
  TZ_ASSIGN_OR_RETURN(TokenFileWriter w, TokenFileWriter::create(path, version, inputs));
  TZ_RETURN_IF_ERROR(w.append(tokens));
  return w.finish();
}

Status write_token_file(const std::string& path, std::span<const std::uint16_t> tokens) {
  const std::vector<std::uint32_t> wide(tokens.begin(), tokens.end());
  return write_token_file(path, wide, kTokenFileVersion);
}

std::vector<std::uint32_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::uint32_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    order[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(i);
  // mt19937_64's output sequence is fixed by the standard; the bounded draw is ours (the standard
  // distributions differ between libraries), so every rank and platform shuffles alike.
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)};
  std::mt19937_64 gen(seq);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const std::uint64_t bound = static_cast<std::uint64_t>(i) + 1;
    // Rejection keeps the draw uniform: values at or above the largest multiple of `bound` retry.
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                                std::numeric_limits<std::uint64_t>::max() % bound;
    std::uint64_t r = gen();
    while (r >= limit) r = gen();
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(r % bound)]);
  }
  return order;
}

DataLoader::DataLoader(std::shared_ptr<const TokenData> data, const LoaderOptions& opt,
                       std::int64_t seqs, std::int64_t rounds)
    : data_(std::move(data)), opt_(opt), seqs_(seqs), rounds_(rounds) {}

Result<DataLoader> DataLoader::create(std::shared_ptr<const TokenData> data,
                                      const LoaderOptions& opt) {
  TZ_ASSERT(data != nullptr, "DataLoader needs data");
  if (opt.micro_batch <= 0 || opt.seq <= 0 || opt.world_size <= 0 || opt.rank < 0 ||
      opt.rank >= opt.world_size) {
    return Status::invalid_argument(
        "data loader: micro batch " + std::to_string(opt.micro_batch) + ", seq " +
        std::to_string(opt.seq) + ", rank " + std::to_string(opt.rank) + " of " +
        std::to_string(opt.world_size) + ": sizes must be positive and the rank in range");
  }
  const auto n = static_cast<std::int64_t>(data->tokens.size());
  const std::int64_t seqs = n > 0 ? (n - 1) / opt.seq : 0;
  const std::int64_t per_round = static_cast<std::int64_t>(opt.world_size) * opt.micro_batch;
  const std::int64_t rounds = seqs / per_round;
  if (rounds == 0) {
    const std::int64_t needed = per_round * opt.seq + 1;
    return Status::invalid_argument(
        data->path + ": " + std::to_string(n) +
        " tokens, fewer than one micro-batch per rank needs (" + std::to_string(needed) + " = " +
        std::to_string(opt.world_size) + " ranks x batch " + std::to_string(opt.micro_batch) +
        " x seq " + std::to_string(opt.seq) +
        " + 1); use a longer file or a smaller --seq / batch");
  }
  if (seqs > static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max())) {
    return Status::invalid_argument(data->path + ": more sequences than a 32-bit order holds");
  }
  return DataLoader(std::move(data), opt, seqs, rounds);
}

std::int64_t DataLoader::tokens_per_micro_batch() const {
  return static_cast<std::int64_t>(opt_.micro_batch) * opt_.seq;
}

void DataLoader::ensure_epoch(std::int64_t epoch) const {
  if (order_epoch_ == epoch) return;
  order_ = shuffled_order(seqs_, opt_.seed, epoch);
  order_epoch_ = epoch;
}

std::int64_t DataLoader::sequence_of(std::int64_t b, int row) const {
  const std::int64_t epoch = b / rounds_;
  const std::int64_t round = b % rounds_;
  const std::int64_t pos = (round * opt_.world_size + opt_.rank) * opt_.micro_batch + row;
  if (!opt_.shuffle) return pos;
  ensure_epoch(epoch);
  return order_[static_cast<std::size_t>(pos)];
}

void DataLoader::batch(std::int64_t b, std::span<std::int32_t> tokens,
                       std::span<std::int32_t> targets) const {
  TZ_ASSERT(b >= 0, "negative micro-batch index");
  const auto bt = static_cast<std::size_t>(tokens_per_micro_batch());
  TZ_ASSERT(tokens.size() == bt && targets.size() == bt, "batch spans must hold B*T tokens");
  const auto t = static_cast<std::size_t>(opt_.seq);
  for (int row = 0; row < opt_.micro_batch; ++row) {
    const auto start = static_cast<std::size_t>(sequence_of(b, row)) * t;
    const std::uint32_t* src = data_->tokens.data() + start;
    const std::size_t off = static_cast<std::size_t>(row) * t;
    for (std::size_t j = 0; j < t; ++j) {
      tokens[off + j] = static_cast<std::int32_t>(src[j]);
      targets[off + j] = static_cast<std::int32_t>(src[j + 1]);
    }
  }
}

void DataLoader::next(std::span<std::int32_t> tokens, std::span<std::int32_t> targets) {
  batch(next_batch_, tokens, targets);
  ++next_batch_;
}

nlohmann::ordered_json DataLoader::state() const {
  // The position is kept as (epoch, sequences of that epoch's order consumed by all ranks), which
  // does not depend on the rank count or micro-batch size, so a run can resume on other ranks.
  const std::int64_t per_round = static_cast<std::int64_t>(opt_.world_size) * opt_.micro_batch;
  nlohmann::ordered_json s;
  s["epoch"] = next_batch_ / rounds_;
  s["sequences"] = next_batch_ % rounds_ * per_round;
  s["seq"] = opt_.seq;
  s["shuffle"] = opt_.shuffle;
  s["seed"] = opt_.seed;
  s["tokens"] = data_->tokens.size();
  s["micro_batch"] = opt_.micro_batch;  // informational: the saving run's sizes
  s["world_size"] = opt_.world_size;
  return s;
}

Status DataLoader::restore(const nlohmann::json& state) {
  auto check = [&](const char* key, const nlohmann::json& expected) -> Status {
    if (!state.contains(key))
      return Status::invalid_argument(std::string("data loader state: missing ") + key);
    if (state[key] != expected) {
      return Status::invalid_argument(std::string("data loader state: ") + key + " is " +
                                      state[key].dump() + " but this run has " + expected.dump());
    }
    return Status::ok();
  };
  TZ_RETURN_IF_ERROR(check("seq", opt_.seq));
  TZ_RETURN_IF_ERROR(check("shuffle", opt_.shuffle));
  TZ_RETURN_IF_ERROR(check("seed", opt_.seed));
  TZ_RETURN_IF_ERROR(check("tokens", data_->tokens.size()));
  auto count = [&](const char* key) -> Result<std::int64_t> {
    if (!state.contains(key) || !state[key].is_number_integer() || state[key].get<std::int64_t>() < 0)
      return Status::invalid_argument(std::string("data loader state: ") + key +
                                      " must be an integer >= 0");
    return state[key].get<std::int64_t>();
  };
  TZ_ASSIGN_OR_RETURN(const std::int64_t epoch, count("epoch"));
  TZ_ASSIGN_OR_RETURN(const std::int64_t sequences, count("sequences"));
  // This run takes N·B sequences of the epoch's order per round: the saved position must fall on
  // a round boundary, or some sequences would be skipped or read twice.
  const std::int64_t per_round = static_cast<std::int64_t>(opt_.world_size) * opt_.micro_batch;
  if (sequences % per_round != 0) {
    return Status::invalid_argument(
        "data loader state: the checkpoint stopped after " + std::to_string(sequences) +
        " sequences of epoch " + std::to_string(epoch) + ", not a multiple of this run's " +
        std::to_string(opt_.world_size) + " ranks x micro batch " +
        std::to_string(opt_.micro_batch) + "; choose ranks and micro batch whose product divides it");
  }
  const std::int64_t round = sequences / per_round;
  // An epoch shorter in rounds for this run's sizes (its tail does not fill a round) is over.
  next_batch_ = round < rounds_ ? epoch * rounds_ + round : (epoch + 1) * rounds_;
  return Status::ok();
}

Result<ValidationSet> make_validation_set(std::shared_ptr<const TokenData> data,
                                          const LoaderOptions& opt, int requested_batches) {
  LoaderOptions o = opt;
  o.shuffle = false;
  TZ_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::create(std::move(data), o));
  const std::int64_t wanted = (std::max(requested_batches, 1) + o.world_size - 1) / o.world_size;
  const auto per_rank = static_cast<int>(std::min<std::int64_t>(wanted, loader.rounds_per_epoch()));
  return ValidationSet{std::move(loader), per_rank};
}

}  // namespace tz::model
