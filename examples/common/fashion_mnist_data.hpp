#pragma once
// Fashion-MNIST for the examples (examples/fashion_mnist, examples/custom_loop): the flags
// that choose the data and the reading of one split from Debian's dataset-fashion-mnist.

#include <loom/config/reflect.hpp>
#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/idx.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fashion_mnist {

/// The example's data flags, beside every TrainingArguments flag; --help shows them under
/// "example", with these descriptions.
struct DataArguments {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::optional<int64_t> max_train_samples;
  std::optional<int64_t> max_eval_samples;

  static constexpr loom::FieldHelp field_help[] = {
      {"data_dir", "folder with the four IDX .gz files"},
      {"max_train_samples", "use only the first N training images"},
      {"max_eval_samples", "use only the first N test images"},
  };
  static constexpr std::string_view help_heading = "example";
};

/// One split ("train" or "t10k"), at most `limit` images: float32 [N, 1, 28, 28] pixels
/// scaled to [0, 1] and normalized with the training set's mean and deviation, and the int64
/// [N] labels.
inline std::pair<torch::Tensor, torch::Tensor> load_split(const std::filesystem::path& dir, const std::string& prefix,
                                                           std::optional<int64_t> limit) {
  auto images = loom::data::read_idx(dir / (prefix + "-images-idx3-ubyte.gz"));
  auto labels = loom::data::read_idx(dir / (prefix + "-labels-idx1-ubyte.gz"));
  loom::check(images.size(0) == labels.size(0), "{}: {} images but {} labels", prefix, images.size(0), labels.size(0));
  loom::check(!limit || *limit > 0, "--max_{}_samples must be positive, got {}", prefix == "train" ? "train" : "eval",
              limit.value_or(0));
  if (limit && *limit < images.size(0)) {
    images = images.narrow(0, 0, *limit);
    labels = labels.narrow(0, 0, *limit);
  }
  constexpr double mean = 0.2860, stddev = 0.3530;  // Fashion-MNIST training-set statistics
  return {((images.to(torch::kFloat) / 255.0 - mean) / stddev).unsqueeze(1).contiguous(),
          labels.to(torch::kLong).contiguous()};
}

}  // namespace fashion_mnist
