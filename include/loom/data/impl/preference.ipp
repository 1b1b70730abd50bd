#pragma once
// Definitions of data/preference.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/data/preference.hpp>

#include <torch/torch.h>

#include <bit>
#include <cstring>

namespace loom::data {

namespace detail {
// Each side as SftDataset reads it, padded rows only.
inline SftOptions padded_side(const SftOptions& options, const std::filesystem::path& where) {
  check(!options.packing, "PreferenceDataset({}): packing is not for pairs (each pair's sides are rows of their own)",
        where.string());
  return options;
}
}  // namespace detail

LOOM_INLINE PreferenceDataset::PreferenceDataset(const PreferenceFiles& files, const SftOptions& options)
    : chosen_(files.chosen, detail::padded_side(options, files.chosen.ids)), rejected_(files.rejected, options) {
  check(chosen_.examples() == rejected_.examples(), "{} holds {} examples but {} holds {}: a pair is one of each",
        files.chosen.ids.string(), chosen_.examples(), files.rejected.ids.string(), rejected_.examples());
  if (files.margin) {
    margin_ = std::make_shared<const MappedFile>(*files.margin);
    check(static_cast<int64_t>(margin_->bytes().size()) == 4 * chosen_.examples(),
          "{}: {} bytes, expected one float32 margin per pair ({} pairs)", files.margin->string(),
          margin_->bytes().size(), chosen_.examples());
  }
}

LOOM_INLINE PreferenceBatch PreferenceDataset::get_batch(std::span<const int64_t> indices) const {
  const auto chosen = chosen_.get_batch(indices), rejected = rejected_.get_batch(indices);
  const auto mask = [&](const SftDataset& side, const torch::Tensor& ids) {
    auto lengths = torch::empty({static_cast<int64_t>(indices.size()), 1}, torch::kLong);
    for (std::size_t k = 0; k < indices.size(); ++k) lengths[static_cast<int64_t>(k)][0] = side.length(indices[k]);
    return torch::arange(ids.size(1), torch::kLong).unsqueeze(0).lt(lengths).to(torch::kLong);
  };
  PreferenceBatch b{chosen.input_ids, mask(chosen_, chosen.input_ids), chosen.labels,
                    rejected.input_ids, mask(rejected_, rejected.input_ids), rejected.labels, {}, {}, {}};
  if (margin_) {
    b.margin = torch::empty({static_cast<int64_t>(indices.size())}, torch::kFloat);
    auto* out = b.margin.data_ptr<float>();
    const auto* bytes = margin_->bytes().data();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const auto bits = detail::load_le<uint32_t>(bytes, indices[k]);
      out[k] = std::bit_cast<float>(bits);
    }
  }
  return b;
}

}  // namespace loom::data
