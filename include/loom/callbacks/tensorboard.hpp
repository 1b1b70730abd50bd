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
#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

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

LOOM_INLINE void put_varint(std::string& out, uint64_t v);
LOOM_INLINE void put_fixed(std::string& out, uint64_t v, int bytes);
LOOM_INLINE void put_key(std::string& out, uint32_t field, uint32_t wire_type);
LOOM_INLINE void put_bytes(std::string& out, uint32_t field, std::string_view bytes);
LOOM_INLINE void put_double(std::string& out, uint32_t field, double v);
LOOM_INLINE void put_float(std::string& out, uint32_t field, float v);
LOOM_INLINE void put_int64(std::string& out, uint32_t field, int64_t v);
}  // namespace detail

/// CRC-32C (Castagnoli) of `data`, continuing from `crc` (0 starts a new checksum).
LOOM_INLINE uint32_t crc32c(std::string_view data, uint32_t crc = 0);

/// TFRecord's masked CRC-32C of `data`.
LOOM_INLINE uint32_t masked_crc32c(std::string_view data);

/// `payload` framed as one TFRecord (length, masked CRC of length, payload, masked CRC of payload).
LOOM_INLINE std::string frame_record(std::string_view payload);

/// An encoded Event{wall_time, file_version}: the first record of an event file.
LOOM_INLINE std::string file_version_event(double wall_time, std::string_view version = "brain.Event:2");

/// An encoded Event{wall_time, step, summary{value{tag, simple_value}}}: one scalar point.
LOOM_INLINE std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

/// HF's rewrite_logs for one name: eval_x -> eval/x, test_x -> test/x, otherwise train/x.
LOOM_INLINE std::string tag_for(std::string_view metric);

/// Seconds since the Unix epoch, as Event.wall_time.
LOOM_INLINE double wall_time_now();

/// PyTorch's SummaryWriter file name: events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>.
LOOM_INLINE std::string event_file_name(double wall_time);

}  // namespace tensorboard

/// Writes every log entry as TensorBoard scalars under logging_dir (default output_dir/runs),
/// in a subfolder named by --run_name when one is given.
/// path(), is_open(), close() and on_train_end come from LogFile (the current or last event
/// file; a log after on_train_end starts a new one, as HF's callback does).
class TensorBoardLogger : public LogFile {
 public:
  /// Folder for the event file; empty: args.logging_dir, else <output_dir>/runs.
  std::string log_dir;

  /// Creates the event file and writes its file_version record (main process only).
  void on_train_begin(const TrainingArguments& args, TrainerState& state, TrainerControl&);
  /// One scalar Event per metric at state.global_step, then a flush (opens a file first if needed).
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl&, const Metrics& logs);

 private:
  void open_for(const TrainingArguments& args);
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/callbacks/impl/tensorboard.ipp>
#endif
