#pragma once
// Definitions of callbacks/tensorboard.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/callbacks/log_file.hpp>
#include <loom/callbacks/tensorboard.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unistd.h>

namespace loom {

namespace tensorboard {

namespace detail {
LOOM_INLINE void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
LOOM_INLINE void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
LOOM_INLINE void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}
LOOM_INLINE void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
LOOM_INLINE void put_double(std::string& out, uint32_t field, double v) {
  put_key(out, field, 1);
  put_fixed(out, std::bit_cast<uint64_t>(v), 8);
}
LOOM_INLINE void put_float(std::string& out, uint32_t field, float v) {
  put_key(out, field, 5);
  put_fixed(out, std::bit_cast<uint32_t>(v), 4);
}
LOOM_INLINE void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // negative: 10-byte two's complement, as protobuf
}
}  // namespace detail

LOOM_INLINE uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char ch : data) crc = detail::crc32c_table[(crc ^ static_cast<uint8_t>(ch)) & 0xFFU] ^ (crc >> 8);
  return ~crc;
}

LOOM_INLINE uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8U;
}

LOOM_INLINE std::string frame_record(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  detail::put_fixed(out, payload.size(), 8);
  detail::put_fixed(out, masked_crc32c(out), 4);
  out.append(payload);
  detail::put_fixed(out, masked_crc32c(payload), 4);
  return out;
}

LOOM_INLINE std::string file_version_event(double wall_time, std::string_view version) {
  std::string out;
  detail::put_double(out, 1, wall_time);
  detail::put_bytes(out, 3, version);
  return out;
}

LOOM_INLINE std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  detail::put_bytes(summary_value, 1, tag);
  detail::put_float(summary_value, 2, value);
  std::string summary;
  detail::put_bytes(summary, 1, summary_value);
  std::string out;
  detail::put_double(out, 1, wall_time);
  detail::put_int64(out, 2, step);
  detail::put_bytes(out, 5, summary);
  return out;
}

LOOM_INLINE std::string tag_for(std::string_view metric) {
  if (metric.starts_with("eval_")) return "eval/" + std::string(metric.substr(5));
  if (metric.starts_with("test_")) return "test/" + std::string(metric.substr(5));
  return "train/" + std::string(metric);
}

LOOM_INLINE double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

LOOM_INLINE std::string event_file_name(double wall_time) {
  static std::atomic<int64_t> uid{0};
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(wall_time), host.data(),
                     static_cast<long>(::getpid()), uid.fetch_add(1));
}

}  // namespace tensorboard

LOOM_INLINE void TensorBoardLogger::on_train_begin(const TrainingArguments& args, TrainerState& state,
                                                   TrainerControl&) {
  ready(state, [&] { open_for(args); });
}

LOOM_INLINE void TensorBoardLogger::on_log(const TrainingArguments& args, TrainerState& state, TrainerControl&,
                                           const Metrics& logs) {
  if (!ready(state, [&] { open_for(args); })) return;
  const double now = tensorboard::wall_time_now();
  std::string records;
  for (const auto& [name, value] : logs)
    records += tensorboard::frame_record(
        tensorboard::scalar_event(now, state.global_step, tensorboard::tag_for(name), static_cast<float>(value)));
  write(records);
}

LOOM_INLINE void TensorBoardLogger::open_for(const TrainingArguments& args) {
  std::filesystem::path dir = !log_dir.empty()       ? std::filesystem::path(log_dir)
                              : args.logging_dir     ? std::filesystem::path(*args.logging_dir)
                                                     : std::filesystem::path(args.output_dir) / "runs";
  // --run_name: the run's own folder, which TensorBoard lists under that name.
  if (args.run_name && !args.run_name->empty()) dir /= *args.run_name;
  const double now = tensorboard::wall_time_now();
  open(dir / tensorboard::event_file_name(now), Mode::create, "TensorBoard event file ");
  write(tensorboard::frame_record(tensorboard::file_version_event(now)));
}

}  // namespace loom
