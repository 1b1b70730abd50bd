#pragma once
// Hugging Face model folders: `config.json` read into (and written from) a model's config
// struct, and the weights in `model.safetensors` or in the shards that
// `model.safetensors.index.json` lists, checked strictly against the module's names and
// shapes. pretrained.hpp's PreTrainedModel, which every family (gpt2.hpp, bert.hpp) derives
// from, builds from_pretrained / save_pretrained on these.
//
// config.json: each field of the config struct is read from the key of its name (HF's names
// and defaults live in the struct); keys the struct does not know (architectures,
// transformers_version, dtype, ...) are left alone, as HF's own files carry many. A known key
// with the wrong type, and a `model_type` other than the family's, are `loom:` errors naming
// the file and the field. Supported field types: what config/reflect.hpp reads (bool,
// integers, floating point, std::string, std::optional of those) plus HF's label maps,
// std::map<int64_t, std::string> (id2label) and std::map<std::string, int64_t> (label2id).
//
// Weights: every parameter and buffer of the module must be in the file with its shape, and
// the file may hold nothing else except the names the family declares in HfNameRules (tied
// copies such as GPT-2's lm_head.weight, legacy buffers such as attn.bias). Stored float
// tensors of another precision (bf16, fp16) are converted to the module's dtype.
//
// Saving writes what transformers' save_pretrained writes: config.json (sorted keys, with
// model_type and architectures) and model.safetensors with metadata {"format": "pt"}, or,
// over max_shard_size bytes, model-0000i-of-0000n.safetensors shards filled greedily in
// parameter order plus model.safetensors.index.json ({"metadata": {total_parameters,
// total_size}, "weight_map"}).

#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/json.hpp>
#include <loom/config/meta.hpp>
#include <loom/config/reflect.hpp>
#include <loom/core/error.hpp>

#include <boost/pfr.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::models {

/// HF's file names inside a model folder.
inline constexpr std::string_view config_file = "config.json";
inline constexpr std::string_view weights_file = "model.safetensors";
inline constexpr std::string_view weights_index_file = "model.safetensors.index.json";

/// What a model family allows beyond its own parameter names when it reads weights.
struct HfNameRules {
  /// HF's base_model_prefix ("transformer", "bert"): a file of the bare base model (every
  /// name without the prefix, as the original GPT-2 checkpoint) is read with it added.
  std::string base_prefix;
  /// Names a file may hold that are not parameters here (a tied copy: lm_head.weight); when
  /// present their shape must equal `derived_from`'s.
  std::vector<std::pair<std::string, std::string>> derived;  ///< {name, derived_from}
  /// Name suffixes of legacy buffers that are skipped when present (GPT-2's ".attn.bias").
  std::vector<std::string> ignored_suffixes;
  /// Parameters a file may lack, which then keep the model's initialization, with a warning
  /// naming them (a classifier's head read from a causal LM's file: transformers' "newly
  /// initialized" weights).
  std::vector<std::string> may_be_new;
};

/// How save_pretrained writes the weights.
struct SaveOptions {
  /// Largest shard in bytes before the weights are split (HF's default "50GB"); a tensor
  /// larger than this gets a shard of its own.
  int64_t max_shard_size = 50'000'000'000;
};

/// Bounds on config.json's sizes, far above any published model (the largest vocabularies
/// hold about 256K tokens, the widest models 16K to 25K, the deepest about 130 layers) and low
/// enough that the tensors they imply have sizes that fit in int64: a config beyond them is a
/// mistake, refused before anything is allocated.
struct ConfigLimits {
  static constexpr int64_t vocab_size = int64_t{1} << 24;     ///< 16,777,216 tokens (also token types)
  static constexpr int64_t width = int64_t{1} << 16;          ///< 65,536 (hidden size; heads divide it)
  static constexpr int64_t layers = int64_t{1} << 10;         ///< 1,024 blocks
  static constexpr int64_t feed_forward = int64_t{1} << 18;   ///< 262,144 (intermediate width)
  static constexpr int64_t positions = int64_t{1} << 20;      ///< 1,048,576 learned positions
  static constexpr int64_t labels = int64_t{1} << 20;         ///< 1,048,576 classifier outputs
};

/// A size field of a config: a loom::Error naming `where` and `field` unless 0 < value <= limit.
LOOM_INLINE void check_config_size(std::string_view where, std::string_view field, int64_t value, int64_t limit);

/// A tensor whose shape follows from a config (a family's config_shapes(config)), with the
/// config fields it reads, as the message names them ("vocab_size, n_embd").
struct ConfigShape {
  std::string name;            ///< the tensor's name in HF's files
  std::vector<int64_t> shape;  ///< its shape under the config
  std::string fields;          ///< the config fields the shape comes from
};

/// The names and shapes of the tensors in an HF folder's weight files (model.safetensors, or
/// the shards model.safetensors.index.json names), read from their headers: no data is read.
LOOM_INLINE std::map<std::string, std::vector<int64_t>> read_hf_weight_shapes(const std::filesystem::path& dir);

/// Compares `expected` with the shapes in `dir`'s weight files before a model is built: a
/// missing tensor or another shape is one loom::Error listing every difference, naming the
/// config fields (`config_where`, the config file). A file of the bare base model (names
/// without the first component, HF's base_model_prefix) is matched too.
LOOM_INLINE void check_config_shapes(const std::filesystem::path& dir, const std::vector<ConfigShape>& expected,
                                     std::string_view config_where);

/// The tensors of an HF folder's weights: model.safetensors if present, else the shards
/// named by model.safetensors.index.json (each shard must hold exactly the names the
/// index maps to it). CPU tensors, in file order.
LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> read_hf_weights(const std::filesystem::path& dir);

/// Where each tensor of an HF folder's weights lies (as read_hf_weights, from the headers
/// alone: no data is read), in file order.
LOOM_INLINE std::vector<checkpoint::TensorLocation> locate_hf_weights(const std::filesystem::path& dir);

/// Copies the weights of `dir` into `module`'s parameters and buffers under `rules`: every
/// name and shape must match, else one loom::Error lists every difference and the module is
/// left untouched. Tensors are read one at a time. A storage-less parameter (a model built
/// under DeferredInit) is not read: the model reads its slices from the files when it is
/// materialized (core/deferred.hpp).
LOOM_INLINE void load_hf_weights(torch::nn::Module& module, const std::filesystem::path& dir,
                                 const HfNameRules& rules);

/// Writes `module`'s parameters and buffers as HF's save_pretrained does (see the top of
/// this file); `dir` is created when missing, and weight files of an earlier save that
/// this one does not rewrite are removed.
LOOM_INLINE void save_hf_weights(const torch::nn::Module& module, const std::filesystem::path& dir,
                                 const SaveOptions& options = {});

/// The total size (bytes) of HF's "50GB"-style sizes: an integer with an optional unit
/// B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB (powers of 1024).
LOOM_INLINE int64_t parse_shard_size(std::string_view text);

namespace detail {

template <class F>
inline constexpr bool is_id2label_v = std::is_same_v<F, std::map<int64_t, std::string>>;
template <class F>
inline constexpr bool is_label2id_v = std::is_same_v<F, std::map<std::string, int64_t>>;
/// A field kept as JSON (a nested object such as rope_parameters, or a value HF types loosely:
/// eos_token_id may be a list): read and written as it is; the family's validate checks it.
template <class F>
inline constexpr bool is_json_v = std::is_same_v<F, nlohmann::json>;

/// The model_type values Config reads: Config::model_types when the family serves several
/// (then model_type is a field of the config), else Config::model_type.
template <class Config>
std::vector<std::string_view> model_types() {
  if constexpr (requires { Config::model_types; })
    return {Config::model_types.begin(), Config::model_types.end()};
  else
    return {Config::model_type};
}

/// The model_type `config` is written with.
template <class Config>
std::string model_type_of(const Config& config) {
  if constexpr (requires { Config::model_types; }) return config.model_type;
  else return std::string(Config::model_type);
}

/// id2label from a JSON object {"0": "neg", ...}; a key that is not an integer, or a value
/// that is not a string, throws "loom: JSON key 'id2label' ...".
LOOM_INLINE std::map<int64_t, std::string> read_id2label(const nlohmann::json& value);
/// label2id from a JSON object {"neg": 0, ...}.
LOOM_INLINE std::map<std::string, int64_t> read_label2id(const nlohmann::json& value);

/// Reads config.json (strict JSON) and checks model_type (one of `model_types`); the object
/// comes back.
LOOM_INLINE nlohmann::json read_config_json(const std::filesystem::path& path,
                                            const std::vector<std::string_view>& model_types);

/// `fields` plus model_type, architectures and dtype: config.json's object.
LOOM_INLINE nlohmann::json with_hf_keys(nlohmann::json fields, std::string_view model_type,
                                        std::string_view architecture, torch::ScalarType dtype);
/// Writes `j` with indent 2 and its keys in sorted order, atomically.
LOOM_INLINE void write_sorted_json(const nlohmann::json& j, const std::filesystem::path& path);

}  // namespace detail

/// Reads `dir`/config.json into Config: each field from the key of its name, other keys
/// ignored; a wrong type or a model_type other than Config::model_type is a loom::Error
/// naming the file and the field.
template <class Config>
Config read_hf_config(const std::filesystem::path& dir) {
  const auto path = dir / config_file;
  const nlohmann::json j = detail::read_config_json(path, detail::model_types<Config>());
  Config config{};
  constexpr auto names = boost::pfr::names_as_array<Config>();
  try {
    boost::pfr::for_each_field(config, [&]<class F>(F& field, std::size_t index) {
      const std::string key(names[index]);
      const auto it = j.find(key);
      if (it == j.end()) return;
      if constexpr (detail::is_json_v<F>) {
        field = *it;
      } else if constexpr (detail::is_id2label_v<F>) {
        field = detail::read_id2label(*it);
      } else if constexpr (detail::is_label2id_v<F>) {
        field = detail::read_label2id(*it);
      } else if constexpr (loom::json::is_field<F>) {
        loom::json::read_field(field, *it, key);
      } else {
        static_assert(dependent_false_v<F>, "loom: a config field must be a scalar, an optional scalar, or a label map");
      }
    });
  } catch (const Error& e) {
    loom::json::rethrow_with_path(path, e);
  }
  return config;
}

/// `config` as config.json holds it: every field (an empty optional as null; a config with
/// `written(key)` leaves out the keys it declines), plus model_type, architectures =
/// [architecture] and dtype (the weights' dtype, as HF writes it).
template <class Config>
nlohmann::json hf_config_json(const Config& config, std::string_view architecture,
                              torch::ScalarType dtype = torch::kFloat32) {
  nlohmann::json fields = nlohmann::json::object();
  constexpr auto names = boost::pfr::names_as_array<Config>();
  boost::pfr::for_each_field(config, [&]<class F>(const F& field, std::size_t index) {
    const std::string key(names[index]);
    if constexpr (requires { config.written(key); })
      if (!config.written(key)) return;
    if constexpr (detail::is_json_v<F>) {
      fields[key] = field;
    } else if constexpr (detail::is_id2label_v<F>) {
      nlohmann::json m = nlohmann::json::object();
      for (const auto& [id, label] : field) m[std::to_string(id)] = label;
      fields[key] = std::move(m);
    } else if constexpr (detail::is_label2id_v<F>) {
      nlohmann::json m = nlohmann::json::object();
      for (const auto& [label, id] : field) m[label] = id;
      fields[key] = std::move(m);
    } else {
      fields[key] = nlohmann::json(loom::json::field_to_json(field));
    }
  });
  return detail::with_hf_keys(std::move(fields), detail::model_type_of(config), architecture, dtype);
}

/// Writes `config` as `dir`/config.json (hf_config_json), keys sorted as HF does.
template <class Config>
void write_hf_config(const Config& config, const std::filesystem::path& dir, std::string_view architecture,
                     torch::ScalarType dtype = torch::kFloat32) {
  detail::write_sorted_json(hf_config_json(config, architecture, dtype), dir / config_file);
}

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/hf_folder.ipp>
#endif
