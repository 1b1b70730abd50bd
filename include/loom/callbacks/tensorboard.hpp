#pragma once
// TensorBoardLogger: scalar logs as TensorBoard event files, written without TensorFlow or
// a protobuf library. The format, written by hand here:
//   - a file is a sequence of TFRecords: u64 length (little endian), u32 masked CRC-32C of
//     those 8 bytes, the payload, u32 masked CRC-32C of the payload;
//     masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8;
//   - each payload is a tensorflow.Event protobuf: wall_time (1, double), step (2, int64),
//     file_version (3, string) or summary (5, Summary{value (1): Value{tag (1, string),
//     simple_value (2, float)}}).
// The first record carries file_version "brain.Event:2"; then each on_log writes one Event
// per metric, tagged as HF's TensorBoardCallback does (rewrite_logs: eval_x -> eval/x,
// test_x -> test/x, anything else -> train/x), at state.global_step, and flushes.
// Only the world main process writes.

#include <loom/callbacks/log_file.hpp>
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

/// The TensorBoard event-file format: CRC-32C, TFRecord framing, Event encoding, tag names.
namespace tensorboard {

namespace detail {
inline constexpr std::array<uint32_t, 256> crc32c_table = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1U) ? (c >> 1) ^ 0x82F63B78U : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}();

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
inline void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }
inline void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
inline void put_double(std::string& out, uint32_t field, double v) {
  put_key(out, field, 1);
  put_fixed(out, std::bit_cast<uint64_t>(v), 8);
}
inline void put_float(std::string& out, uint32_t field, float v) {
  put_key(out, field, 5);
  put_fixed(out, std::bit_cast<uint32_t>(v), 4);
}
inline void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // negative: 10-byte two's complement, as protobuf
}
}  // namespace detail

/// CRC-32C (Castagnoli) of `data`, continuing from `crc` (0 starts a new checksum).
inline uint32_t crc32c(std::string_view data, uint32_t crc = 0) {
  crc = ~crc;
  for (const char ch : data) crc = detail::crc32c_table[(crc ^ static_cast<uint8_t>(ch)) & 0xFFU] ^ (crc >> 8);
  return ~crc;
}

/// TFRecord's masked CRC-32C of `data`.
inline uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8U;
}

/// `payload` framed as one TFRecord (length, masked CRC of length, payload, masked CRC of payload).
inline std::string frame_record(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  detail::put_fixed(out, payload.size(), 8);
  detail::put_fixed(out, masked_crc32c(out), 4);
  out.append(payload);
  detail::put_fixed(out, masked_crc32c(payload), 4);
  return out;
}

/// An encoded Event{wall_time, file_version}: the first record of an event file.
inline std::string file_version_event(double wall_time, std::string_view version = "brain.Event:2") {
  std::string out;
  detail::put_double(out, 1, wall_time);
  detail::put_bytes(out, 3, version);
  return out;
}

/// An encoded Event{wall_time, step, summary{value{tag, simple_value}}}: one scalar point.
inline std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
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

/// HF's rewrite_logs for one name: eval_x -> eval/x, test_x -> test/x, otherwise train/x.
inline std::string tag_for(std::string_view metric) {
  if (metric.starts_with("eval_")) return "eval/" + std::string(metric.substr(5));
  if (metric.starts_with("test_")) return "test/" + std::string(metric.substr(5));
  return "train/" + std::string(metric);
}

/// Seconds since the Unix epoch, as Event.wall_time.
inline double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// PyTorch's SummaryWriter file name: events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>.
inline std::string event_file_name(double wall_time) {
  static std::atomic<int64_t> uid{0};
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(wall_time), host.data(),
                     static_cast<long>(::getpid()), uid.fetch_add(1));
}

}  // namespace tensorboard

/// Writes every log entry as TensorBoard scalars under logging_dir (default output_dir/runs).
/// path(), is_open(), close() and on_train_end come from LogFile (the current or last event
/// file; a log after on_train_end starts a new one, as HF's callback does).
class TensorBoardLogger : public LogFile {
 public:
  /// Folder for the event file; empty: args.logging_dir, else <output_dir>/runs.
  std::string log_dir;

  /// Creates the event file and writes its file_version record (main process only).
  void on_train_begin(const TrainingArguments& args, TrainerState& state, TrainerControl&) {
    ready(state, [&] { open_for(args); });
  }
  /// One scalar Event per metric at state.global_step, then a flush (opens a file first if needed).
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl&, const Metrics& logs) {
    if (!ready(state, [&] { open_for(args); })) return;
    const double now = tensorboard::wall_time_now();
    std::string records;
    for (const auto& [name, value] : logs)
      records += tensorboard::frame_record(
          tensorboard::scalar_event(now, state.global_step, tensorboard::tag_for(name), static_cast<float>(value)));
    write(records);
  }

 private:
  void open_for(const TrainingArguments& args) {
    const std::filesystem::path dir = !log_dir.empty()       ? std::filesystem::path(log_dir)
                                      : args.logging_dir     ? std::filesystem::path(*args.logging_dir)
                                                             : std::filesystem::path(args.output_dir) / "runs";
    const double now = tensorboard::wall_time_now();
    open(dir / tensorboard::event_file_name(now), Mode::create, "TensorBoard event file ");
    write(tensorboard::frame_record(tensorboard::file_version_event(now)));
  }
};

}  // namespace loom
