#pragma once
// Definitions of models/hf_folder.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/text.hpp>
#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/models/hf_folder.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::models {

namespace detail {

// "a, b, c" (at most `limit` items, then "... (N in all)").
LOOM_INLINE std::string join_names(const std::vector<std::string>& names, std::size_t limit = 12) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > limit) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

inline constexpr std::string_view kModelFolderHint = "an HF model folder holds config.json and model.safetensors";

LOOM_INLINE std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kFloat64: return "float64";
    default: return std::string(c10::toString(t));
  }
}

// Writes `j` with indent 2 and its keys in sorted order (nlohmann::json keeps them sorted),
// atomically.
LOOM_INLINE void write_sorted_json(const nlohmann::json& j, const std::filesystem::path& path) {
  loom::json::write_file(nlohmann::ordered_json::parse(j.dump()), path);
}

LOOM_INLINE std::map<int64_t, std::string> read_id2label(const nlohmann::json& value) {
  const auto bad = [&](const std::string& why) {
    return Error("loom: JSON key 'id2label' expects an object of \"<integer>\": \"<label>\" pairs; " + why);
  };
  if (value.is_null()) return {};  // transformers writes null for an absent map
  if (!value.is_object()) throw bad("got " + loom::json::describe(value));
  std::map<int64_t, std::string> out;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size()) throw bad("the key \"" + key + "\" is not an integer");
    if (!it->is_string()) throw bad("the value of \"" + key + "\" is " + loom::json::describe(*it));
    out[id] = it->get<std::string>();
  }
  return out;
}

LOOM_INLINE std::map<std::string, int64_t> read_label2id(const nlohmann::json& value) {
  const auto bad = [&](const std::string& why) {
    return Error("loom: JSON key 'label2id' expects an object of \"<label>\": <integer> pairs; " + why);
  };
  if (value.is_null()) return {};  // transformers writes null for an absent map
  if (!value.is_object()) throw bad("got " + loom::json::describe(value));
  std::map<std::string, int64_t> out;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!it->is_number_integer()) throw bad("the value of \"" + it.key() + "\" is " + loom::json::describe(*it));
    out[it.key()] = it->get<int64_t>();
  }
  return out;
}

LOOM_INLINE nlohmann::json read_config_json(const std::filesystem::path& path,
                                            const std::vector<std::string_view>& model_types) {
  check_path(path.parent_path(), PathKind::folder, kModelFolderHint);
  check_path(path, PathKind::file, kModelFolderHint);
  nlohmann::json j = json::read_file(path);
  const json::Fields f(j, path.string());
  if (f.has("model_type")) {
    const std::string found = f.string("model_type");
    if (std::find(model_types.begin(), model_types.end(), found) == model_types.end()) {
      std::string known;
      for (const auto& t : model_types) known += (known.empty() ? "\"" : ", \"") + std::string(t) + "\"";
      f.fail("model_type", "is \"" + found + "\", but this model reads " + known);
    }
  }
  return j;
}

LOOM_INLINE nlohmann::json with_hf_keys(nlohmann::json fields, std::string_view model_type,
                                        std::string_view architecture, torch::ScalarType dtype) {
  fields["model_type"] = std::string(model_type);
  fields["architectures"] = nlohmann::json::array({std::string(architecture)});
  fields["dtype"] = dtype_name(dtype);
  return fields;
}

}  // namespace detail

namespace detail {

// `dir` is a folder holding model.safetensors or the shards' index (a pytorch_model.bin alone
// is named: loom does not read pickles).
LOOM_INLINE void check_weights_folder(const std::filesystem::path& dir) {
  check_path(dir, PathKind::folder, kModelFolderHint);
  if (path_exists(dir / weights_file, PathKind::file) || path_exists(dir / weights_index_file, PathKind::file)) return;
  const bool bin = path_exists(dir / "pytorch_model.bin", PathKind::file);
  fail("{} holds neither {} nor {}{}", dir.string(), weights_file, weights_index_file,
       bin ? " (its pytorch_model.bin is a pickle, which loom does not read: save the model with "
             "safe_serialization, as transformers does by default)"
           : "");
}

}  // namespace detail

LOOM_INLINE void check_config_size(std::string_view where, std::string_view field, int64_t value, int64_t limit) {
  check(value > 0 && value <= limit, "{}: field '{}' must be a positive integer at most {}, got {}", where, field,
        limit, value);
}

LOOM_INLINE std::map<std::string, std::vector<int64_t>> read_hf_weight_shapes(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<int64_t>> out;
  for (auto& at : locate_hf_weights(dir)) out[at.entry.name] = std::move(at.entry.shape);
  return out;
}

LOOM_INLINE void check_config_shapes(const std::filesystem::path& dir, const std::vector<ConfigShape>& expected,
                                     std::string_view config_where) {
  const auto shapes = read_hf_weight_shapes(dir);
  std::vector<std::string> problems;
  for (const auto& want : expected) {
    auto it = shapes.find(want.name);
    if (const auto dot = want.name.find('.'); it == shapes.end() && dot != std::string::npos)
      it = shapes.find(want.name.substr(dot + 1));  // a file of the bare base model
    if (it == shapes.end()) {
      problems.push_back("no " + want.name + " in the weights (" + want.fields + ")");
    } else if (it->second != want.shape) {
      problems.push_back(want.fields + " give " + want.name + " the shape " +
                         checkpoint::detail::shape_string(want.shape) + ", the weights " +
                         checkpoint::detail::shape_string(it->second));
    }
  }
  if (problems.empty()) return;
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
  fail("{} does not match the weights in {}: {}", config_where, dir.string(), all);
}

LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> read_hf_weights(const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& at : locate_hf_weights(dir)) out.emplace_back(at.entry.name, checkpoint::read_tensor(at));
  return out;
}

LOOM_INLINE std::vector<checkpoint::TensorLocation> locate_hf_weights(const std::filesystem::path& dir) {
  detail::check_weights_folder(dir);
  return checkpoint::locate_model_weights(dir / weights_file);
}

LOOM_INLINE void load_hf_weights(torch::nn::Module& module, const std::filesystem::path& dir,
                                 const HfNameRules& rules) {
  auto file = locate_hf_weights(dir);
  const auto where = path_exists(dir / weights_file, PathKind::file) ? dir / weights_file : dir / weights_index_file;
  const auto shape_of = [](const checkpoint::TensorLocation& at) { return c10::IntArrayRef(at.entry.shape); };

  std::unordered_map<std::string, torch::Tensor> targets;  // the module's parameters and buffers
  std::vector<std::string> order;
  for (const auto& p : module.named_parameters(true)) order.push_back(p.key()), targets[p.key()] = p.value();
  for (const auto& b : module.named_buffers(true))
    if (b.value().defined()) order.push_back(b.key()), targets[b.key()] = b.value();

  // A file of the bare base model: HF adds base_model_prefix to every name.
  if (!rules.base_prefix.empty()) {
    const std::string prefix = rules.base_prefix + ".";
    const auto has_prefix = [&](const std::string& n) { return n.rfind(prefix, 0) == 0; };
    const bool file_prefixed =
        std::any_of(file.begin(), file.end(), [&](const auto& at) { return has_prefix(at.entry.name); });
    if (!file_prefixed && std::any_of(order.begin(), order.end(), has_prefix))
      for (auto& at : file) at.entry.name = prefix + at.entry.name;
  }

  std::vector<std::pair<torch::Tensor, const checkpoint::TensorLocation*>> copies;
  auto reader = std::make_shared<checkpoint::SliceReader>();  // for the storage-less parameters
  std::set<std::string> found;
  std::vector<std::string> missing, unexpected, problems;
  for (const auto& at : file) {
    const std::string& name = at.entry.name;
    const auto derived = std::find_if(rules.derived.begin(), rules.derived.end(),
                                      [&](const auto& d) { return d.first == name; });
    if (derived != rules.derived.end() && !targets.contains(name)) {
      const auto source = targets.find(derived->second);
      if (source != targets.end() && shape_of(at) != source->second.sizes()) {
        problems.push_back("shape of " + name + " is " + checkpoint::detail::shape_string(at.entry.shape) +
                           " in the file but " + checkpoint::detail::shape_string(source->second.sizes()) +
                           " in the model (it is tied to " + derived->second + ")");
      } else {
        // A tied copy must be a copy: other values are weights of their own (a model trained
        // untied), which the tie would drop without a word. (The two are read whole, once.)
        const auto from = std::find_if(file.begin(), file.end(), [&](const auto& e) { return e.entry.name == derived->second; });
        if (from != file.end() && shape_of(*from) == shape_of(at) &&
            !torch::equal(checkpoint::read_tensor(*from), checkpoint::read_tensor(at)))
          problems.push_back(name + " differs from " + derived->second + " in the file, but the config ties them "
                             "(tie_word_embeddings true): its own values would be dropped; if the model was trained "
                             "untied, set tie_word_embeddings to false in config.json");
      }
      continue;
    }
    const auto it = targets.find(name);
    if (it == targets.end()) {
      const bool legacy = std::any_of(rules.ignored_suffixes.begin(), rules.ignored_suffixes.end(),
                                      [&](const std::string& s) {
                                        return name.size() >= s.size() && name.ends_with(s);
                                      });
      if (!legacy) unexpected.push_back(name);
      continue;
    }
    found.insert(name);
    const auto& target = it->second;
    if (shape_of(at) != target.sizes()) {
      problems.push_back("shape of " + name + " is " + checkpoint::detail::shape_string(at.entry.shape) +
                         " in the file but " + checkpoint::detail::shape_string(target.sizes()) + " in the model");
    } else if (torch::isFloatingType(at.entry.dtype->type) != target.is_floating_point()) {
      problems.push_back("dtype of " + name + " is " + std::string(c10::toString(at.entry.dtype->type)) +
                         " in the file but " + std::string(c10::toString(target.scalar_type())) + " in the model");
    } else if (holds_no_storage(target)) {
      reader->add(name, at);
    } else {
      copies.emplace_back(target, &at);
    }
  }
  std::vector<std::string> fresh;
  for (const auto& name : order) {
    if (found.contains(name)) continue;
    if (std::find(rules.may_be_new.begin(), rules.may_be_new.end(), name) != rules.may_be_new.end())
      fresh.push_back(name);
    else
      missing.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !problems.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back("missing " + detail::join_names(missing));
    if (!unexpected.empty()) parts.push_back("unexpected " + detail::join_names(unexpected));
    parts.insert(parts.end(), problems.begin(), problems.end());
    std::string all;
    for (const auto& p : parts) all += (all.empty() ? "" : "; ") + p;
    fail("{} does not match the model: {}", where.string(), all);
  }
  if (!fresh.empty())
    log_message(LogLevel::warning, "{} holds no {}: initialized as new (train it before use)", where.string(),
                detail::join_names(fresh));
  if (!reader->empty()) {
    auto* values = dynamic_cast<DeferredValues*>(&module);
    check(values != nullptr, "{}: the model has parameters without memory but gives no values for them (build the "
          "model itself under loom::DeferredInit)", where.string());
    values->read_weights_from(std::move(reader));
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, at] : copies) target.copy_(checkpoint::read_tensor(*at));
}

LOOM_INLINE void save_hf_weights(const torch::nn::Module& module, const std::filesystem::path& dir,
                                 const SaveOptions& options) {
  check(options.max_shard_size > 0, "max_shard_size must be positive, got {}", options.max_shard_size);
  std::filesystem::create_directories(dir);
  using Named = std::pair<std::string, torch::Tensor>;
  std::vector<Named> all;
  int64_t parameters = 0;
  for (const auto& p : module.named_parameters(true)) {
    all.emplace_back(p.key(), p.value().detach());
    parameters += p.value().numel();
  }
  for (const auto& b : module.named_buffers(true))
    if (b.value().defined()) all.emplace_back(b.key(), b.value().detach());

  // huggingface_hub's split and HF's file names: checkpoint::WeightsWriter.
  std::vector<checkpoint::SafetensorsWriter::Spec> specs;
  for (const auto& [name, t] : all) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  checkpoint::WeightsWriter writer(dir, specs, options.max_shard_size, parameters, {{"format", "pt"}});
  for (const auto& [name, t] : all) writer.write(name, t);
  writer.commit();  // (and removes the weight files of an earlier save there)
}

LOOM_INLINE int64_t parse_shard_size(std::string_view text) { return loom::detail::parse_byte_size(text, "max_shard_size"); }

}  // namespace loom::models
