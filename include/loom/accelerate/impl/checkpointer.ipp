#pragma once
#include <loom/accelerate/checkpointer.hpp>
#include <loom/checkpoint/folders.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/config/json_io.hpp>
#include <loom/config/paths.hpp>
#include <loom/config/reflect.hpp>
#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/peft/lora.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <unordered_map>

namespace loom {

namespace detail {
// The optimizers' files are named from optimizer_file_stem(k): <stem>.safetensors (or <stem>.pt
// for a wrapped torch::optim::Optimizer, or <stem>-R-of-W.safetensors / .json when sharded) and
// <stem>.json.
inline constexpr const char* kRngState = "rng_state.safetensors";
inline constexpr const char* kTrainingArgs = "training_args.json";
}  // namespace detail

LOOM_INLINE void Checkpointer::barrier(const char* what) {
  if (world_.size > 1) engine_->comm()->barrier(what);
}

LOOM_INLINE void Checkpointer::save_weights(const std::filesystem::path& dir) {
  // A model training a LoRA adapter saves the adapter alone, as HF's Trainer saves a
  // PeftModel: the frozen base is the folder it was loaded from. The adapter's tensors are
  // all trainable: FullShard leaves the base sharded meanwhile.
  if (peft::adapter_config(*model_).has_value()) {
    engine_->with_trainable_params([&] {
      if (saves_) peft::save_adapter(*model_, dir);
    });
    return;
  }
  stream_weights(dir, /*merged=*/false);
}

LOOM_INLINE void Checkpointer::stream_weights(const std::filesystem::path& dir, bool merged) {
  // Streamed: the header first (every name, shape and master dtype is known), then each group
  // of parameters as the engine gathers it (FullShard: a unit at a time, every rank taking part,
  // so no rank holds the whole model; the other engines: none, their parameters are whole),
  // then the buffers and the parameters no group held.
  std::unique_ptr<checkpoint::WeightsWriter> writer;
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  std::map<std::string, torch::Tensor> rest;
  // Merged: each layer whose weight is written merged, by its weight's name, and by every tensor
  // of it a group can hold (weight, adapter, 4-bit state: all in the layer's unit).
  std::map<std::string, peft::AdaptableLinearImpl*> layers;
  std::unordered_map<const c10::TensorImpl*, std::string> layer_of;
  if (saves_) {
    if (merged)
      for (const auto& [name, layer] : peft::adaptable_layers(*model_)) {
        if (!layer->has_adapter() && !layer->quantized()) continue;
        const auto weight = name + ".weight";
        layers.emplace(weight, layer);
        std::vector<torch::Tensor> held = layer->state_tensors();
        held.push_back(layer->weight);
        if (layer->has_adapter()) held.insert(held.end(), {layer->lora_A->weight, layer->lora_B->weight});
        for (const auto& t : held) layer_of.emplace(t.unsafeGetTensorImpl(), weight);
      }
    std::vector<checkpoint::SafetensorsWriter::Spec> specs;
    int64_t parameters = 0;
    for (const auto& p : model_->named_parameters(true)) {
      if (merged && peft::is_lora_parameter(p.key())) continue;
      if (const auto it = layers.find(p.key()); it != layers.end()) {
        const auto* layer = it->second;
        const auto shape = layer->weight_shape();
        specs.push_back({p.key(), layer->quantized() ? torch::kFloat : engine_->master_dtype(p.value()), shape});
        parameters += shape[0] * shape[1];
        continue;
      }
      parameters += p.value().numel();
      specs.push_back({p.key(), engine_->master_dtype(p.value()), p.value().sizes().vec()});
      names.emplace(p.value().unsafeGetTensorImpl(), p.key());
      rest.emplace(p.key(), p.value());
    }
    for (const auto& b : model_->named_buffers(true))
      if (b.value().defined()) {
        specs.push_back({b.key(), b.value().scalar_type(), b.value().sizes().vec()});
        rest.emplace(b.key(), b.value());
      }
    // save_pretrained's layout: one model.safetensors up to its default 50GB, else shards and
    // their index (transformers opens both; a resume reads both).
    writer = std::make_unique<checkpoint::WeightsWriter>(dir, specs, checkpoint::kMaxShardSize, parameters);
  }
  // A merged layer's weight, once its group is gathered (or, outside FullShard, everything is).
  const auto write_layer = [&](const std::string& weight) {
    const auto it = layers.find(weight);
    if (it == layers.end()) return;
    writer->write(weight, it->second->merged_weight());
    layers.erase(it);
  };
  engine_->for_each_gathered_group([&](const std::vector<torch::Tensor>& group) {
    if (!writer) return;
    std::set<std::string> gathered;
    for (const auto& t : group) {
      if (const auto it = names.find(t.unsafeGetTensorImpl()); it != names.end()) {
        writer->write(it->second, t);
        rest.erase(it->second);
      } else if (const auto l = layer_of.find(t.unsafeGetTensorImpl()); l != layer_of.end()) {
        gathered.insert(l->second);
      }
    }
    if (group.empty())  // every parameter whole
      for (const auto& [weight, layer] : layers) gathered.insert(weight);
    for (const auto& weight : gathered) write_layer(weight);
  });
  if (!writer) return;
  for (const auto& [name, t] : rest) writer->write(name, t);
  check(layers.empty(), "saving the merged model in {}: layer weight {} was in no gathered group", dir.string(),
        layers.empty() ? std::string() : layers.begin()->first);
  writer->commit();
}

LOOM_INLINE void Checkpointer::write_model_files(const std::filesystem::path& dir, const nlohmann::json& config,
                                                 bool adapter_too) {
  // The base model's config.json belongs with full weights; an adapter folder has its own
  // adapter_config.json (as PEFT's save_pretrained writes it).
  const auto& chosen = config.is_null() ? config_ : config;
  if (!chosen.is_null() && (adapter_too || !peft::adapter_config(*model_)))
    detail::write_json_file(dir / "config.json", chosen, 2);
  for (const auto& file : files_) {
    const auto to = dir / file.filename();
    std::error_code ec;
    std::filesystem::copy_file(file, to, std::filesystem::copy_options::overwrite_existing, ec);
    check(!ec, "cannot copy {} into {}: {}", file.string(), dir.string(), ec.message());
  }
}

LOOM_INLINE void Checkpointer::save_model(const std::filesystem::path& dir, const nlohmann::json& config) {
  if (saves_) std::filesystem::create_directories(dir);
  save_weights(dir);
  if (!saves_) return;
  save_json(*args_, dir / detail::kTrainingArgs);
  write_model_files(dir, config, /*adapter_too=*/false);
}

LOOM_INLINE void Checkpointer::save_merged_model(const std::filesystem::path& dir, const nlohmann::json& config) {
  check(peft::adapter_config(*model_).has_value(),
        "save_merged_model: the model carries no LoRA adapter (save_model writes its weights)");
  if (saves_) std::filesystem::create_directories(dir);
  stream_weights(dir, /*merged=*/true);
  if (!saves_) return;
  write_model_files(dir, config, /*adapter_too=*/true);
}

LOOM_INLINE void Checkpointer::load_weights(const std::filesystem::path& dir) {
  const auto adapter = peft::adapter_config(*model_);
  const bool has_full = checkpoint::has_model_weights(dir);
  const bool has_adapter = path_exists(dir / checkpoint::kAdapterFile, PathKind::file);
  if (adapter) {
    check(has_adapter, "{} holds no {}{}, but the model trains a LoRA adapter", dir.string(), checkpoint::kAdapterFile,
          has_full ? " (its model.safetensors is a full model's: load it before the adapter is added)" : "");
    // The adapter saved must be this one: r and the targets show in the shapes, the scaling not.
    const auto file = dir / peft::adapter_config_file;
    if (path_exists(file, PathKind::file)) {
      const auto saved = peft::lora_config_from_json(json::read_file(file), file.string());
      check(saved.scaling() == adapter->scaling() && saved.lora_dropout == adapter->lora_dropout,
            "{}: the adapter was trained with lora_alpha {}, r {}, lora_dropout {}{}; this run's has lora_alpha {}, r {}, "
            "lora_dropout {}{}", file.string(), saved.lora_alpha, saved.r, saved.lora_dropout,
            saved.use_rslora ? ", use_rslora" : "", adapter->lora_alpha, adapter->r, adapter->lora_dropout,
            adapter->use_rslora ? ", use_rslora" : "");
    }
    engine_->with_trainable_params([&] { peft::load_adapter_weights(*model_, dir); });
    return;
  }
  check(!has_adapter || has_full,
        "{} holds a LoRA adapter ({}), but the model carries none: add the same adapter before loading (--use_peft "
        "with its settings, or --lora_config {})", dir.string(), checkpoint::kAdapterFile,
        (dir / peft::adapter_config_file).string());
  // Whole parameters and buffers are copied; FullShard's parameters, which hold no memory
  // between gathers, take only the slices this rank's shards hold, straight from the file.
  checkpoint::load_module(*model_, dir / checkpoint::kModelFile, [&](std::shared_ptr<const checkpoint::SliceReader> reader) {
    engine_->fill_shards([&](const std::string& name, int64_t begin, int64_t end, torch::Tensor& out) {
      reader->read(name, begin, end, out);
    });
  });
}

LOOM_INLINE void Checkpointer::load_pretrained(const std::string& name_or_path) {
  const auto file = std::filesystem::path(name_or_path) / checkpoint::kModelFile;
  check(path_exists(name_or_path, PathKind::folder, "--model_name_or_path") && checkpoint::has_model_weights(name_or_path),
        "--model_name_or_path {}: {} does not exist (nor {}, a sharded model's index)", name_or_path, file.string(),
        checkpoint::kModelIndexFile);
  check(peft::quantized_base(*model_).layers == 0,
        "--model_name_or_path {}: the model's base is 4-bit already, and a float folder cannot be read into it; read "
        "the folder before making the base 4-bit (from_pretrained, then --load_in_4bit)", name_or_path);
  // The base model's weights; an adapter already on the model stays as it is.
  engine_->with_full_params([&] {
    const peft::HiddenAdapters base(*model_);
    checkpoint::load_module(*model_, file);
  });
}

LOOM_INLINE std::map<std::string, std::vector<int64_t>> Checkpointer::parameter_shapes() const {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model_->named_parameters(true)) shapes[item.key()] = item.value().sizes().vec();
  return shapes;
}

LOOM_INLINE void Checkpointer::save_optimizer(const std::filesystem::path& tmp, OptimizerStep& optimizer,
                                              const std::string& stem) {
  const bool main = saves_;
  auto& opt = optimizer.optimizer();
  if (engine_->shards_optimizer()) {
    const auto shard = fmt::format("{}-{}-of-{}", stem, world_.rank, world_.size);
    checkpoint::save_safetensors(opt.state_tensors(), tmp / (shard + ".safetensors"));
    // Each piece's flat range in its parameter, and the parameter's shape (checked on load).
    nlohmann::json ranges = nlohmann::json::object(), shapes = nlohmann::json::object();
    const auto shape_of = parameter_shapes();
    for (const auto& p : optimizer.pieces()) {
      ranges[p.name] = {p.begin, p.end, p.numel};
      if (auto it = shape_of.find(p.name); it != shape_of.end()) shapes[p.name] = it->second;
    }
    detail::write_json_file(tmp / (shard + ".json"), {{"ranges", ranges}, {"shapes", shapes}}, 2);
  }
  if (!main) return;
  if (!engine_->shards_optimizer()) {
    if (opt.wrapped() != nullptr) {  // torch's own serialization of its optimizer
      torch::serialize::OutputArchive archive;
      opt.wrapped()->save(archive);
      archive.save_to((tmp / (stem + ".pt")).string());
    } else {
      checkpoint::save_safetensors(opt.state_tensors(), tmp / (stem + ".safetensors"));
    }
  }
  detail::write_json_file(tmp / (stem + ".json"), opt.state_meta(), 2);
}

LOOM_INLINE void Checkpointer::save(const TrainerState& state, const std::vector<OptimizerStep*>& optimizers,
                                    const std::vector<JsonPart>& parts) {
  const auto& args = *args_;
  const std::filesystem::path out(args.output_dir);
  // Every rank fills every part: a part may be a collective (the loss window's sum).
  std::vector<nlohmann::json> values;
  values.reserve(parts.size());
  for (const auto& part : parts) values.push_back(part.save());
  const bool main = saves_;  // this folder's writer: rank 0, or this node's local main (save_on_each_node)
  const std::string tag = world_.size > 1 ? std::string("ranks") : checkpoint::detail::pid_string();
  const auto tmp = checkpoint::temporary_checkpoint_dir(out, state.global_step, tag);
  if (main) checkpoint::begin_checkpoint(out, state.global_step, tag);
  barrier("the checkpoint barrier");
  checkpoint::detail::fault_point("begin");
  save_weights(tmp);
  checkpoint::detail::fault_point("weights_written");
  if (!args.save_only_model)
    for (std::size_t k = 0; k < optimizers.size(); ++k) save_optimizer(tmp, *optimizers[k], optimizer_file_stem(k));
  checkpoint::detail::fault_point("optimizer_written");
  if (main && !args.save_only_model) {
    for (std::size_t i = 0; i < parts.size(); ++i) detail::write_json_file(tmp / parts[i].file, values[i], 2);
    std::vector<std::pair<std::string, torch::Tensor>> rng{{"cpu", at::detail::getDefaultCPUGenerator().get_state()}};
    if (torch::cuda::is_available())
      for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i)
        rng.emplace_back("cuda:" + std::to_string(i),
                         at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, i)).get_state());
    checkpoint::save_safetensors(rng, tmp / detail::kRngState);
  }
  if (main) {
    detail::write_json_file(tmp / checkpoint::kTrainerStateFile, nlohmann::json(state.to_json()), 2);
    save_json(args, tmp / detail::kTrainingArgs);
    write_model_files(tmp, nullptr, /*adapter_too=*/false);
  }
  checkpoint::detail::fault_point("state_written");
  barrier("the checkpoint barrier");  // every shard is written
  checkpoint::detail::fault_point("before_commit");
  if (main) {
    const auto final_dir = checkpoint::checkpoint_dir(out, state.global_step);
    log_message(LogLevel::info, "saving model checkpoint to {}", final_dir.string());
    checkpoint::commit_checkpoint(tmp, final_dir);
    checkpoint::detail::fault_point("committed");
    if (args.save_total_limit) {
      std::optional<std::filesystem::path> best;
      if (state.best_model_checkpoint) best = std::filesystem::path(*state.best_model_checkpoint);
      for (const auto& gone : checkpoint::rotate_checkpoints(out, *args.save_total_limit, best))
        log_message(LogLevel::info, "deleting older checkpoint [{}] due to save_total_limit", gone.string());
    }
  }
  barrier("the checkpoint barrier");  // the checkpoint is in place before anyone reads it
}

LOOM_INLINE void Checkpointer::agree_on_resume(const std::optional<std::filesystem::path>& dir, bool failed) {
  // Each node found its checkpoint in its own folder: a save interrupted between two nodes'
  // commits leaves them a checkpoint apart (or one node without any), and resuming each from
  // its own would mix two steps' states, or hang the first collective.
  auto* comm = engine_->comm();
  if (comm == nullptr) return;
  constexpr int64_t kNone = -1, kFailed = -2;
  int64_t step = failed ? kFailed : kNone;
  if (dir) {
    try {
      step = TrainerState::load(*dir / checkpoint::kTrainerStateFile).global_step;
    } catch (const Error&) {
      step = kFailed;  // load() reports it
    }
  }
  const auto options = torch::TensorOptions().dtype(torch::kInt64).device(comm->device());
  auto all = torch::empty({world_.size}, options);
  comm->all_gather(all, torch::full({1}, step, options), "the resume step all-gather").wait();
  const auto steps = all.cpu();
  const auto* s = steps.data_ptr<int64_t>();
  std::string found;
  bool agree = true;
  for (int r = 0; r < world_.size; ++r) {
    agree = agree && s[r] == step;
    found += fmt::format("{}rank {}: {}", r == 0 ? "" : ", ", r,
                         s[r] == kNone     ? std::string("none")
                         : s[r] == kFailed ? std::string("unreadable (its own message says why)")
                                           : fmt::format("step {}", s[r]));
  }
  if (agree || step == kFailed) return;  // a rank that failed reports its own error
  fail("the nodes would resume from different checkpoints, each from its own output folder (save_on_each_node): "
       "{}; a save interrupted between the nodes' commits leaves them apart: give every node a checkpoint of the same "
       "step, --resume_from_checkpoint {}/checkpoint-<step>", found, args_->output_dir);
}

LOOM_INLINE std::optional<std::filesystem::path> Checkpointer::resume_dir() {
  if (!args_->save_on_each_node || !world_.several_nodes()) return find_resume_dir();
  std::optional<std::filesystem::path> dir;
  std::exception_ptr error;
  try {
    dir = find_resume_dir();
  } catch (const Error&) {
    error = std::current_exception();  // after the others know, so they do not wait for this rank
  }
  agree_on_resume(dir, error != nullptr);
  if (error) std::rethrow_exception(error);
  return dir;
}

LOOM_INLINE std::optional<std::filesystem::path> Checkpointer::find_resume_dir() {
  const auto& args = *args_;
  if (!args.resume_from_checkpoint) return std::nullopt;
  const std::filesystem::path out(args.output_dir);
  if (*args.resume_from_checkpoint == "latest") {
    if (saves_ && std::filesystem::exists(out)) checkpoint::remove_stale_temporaries(out);
    barrier("the resume barrier");
    auto latest = std::filesystem::exists(out) ? checkpoint::latest_checkpoint(out) : std::nullopt;
    check(latest.has_value(), "--resume_from_checkpoint latest: no complete checkpoint-N folder in {}", out.string());
    return latest;
  }
  const std::filesystem::path dir(*args.resume_from_checkpoint);
  checkpoint::validate_checkpoint(dir);
  return dir;
}

LOOM_INLINE void Checkpointer::load_optimizer(const std::filesystem::path& dir, OptimizerStep& optimizer,
                                              const std::string& stem) {
  const auto meta_file = dir / (stem + ".json");
  const auto meta = json::read_file(meta_file);
  json::Fields(meta, meta_file.string()).integer("steps", 0);
  if (auto* wrapped = optimizer.optimizer().wrapped()) {
    const auto file = dir / (stem + ".pt");
    optimizer.optimizer().load_state({}, meta);  // the step count; the algorithm must be the same
    check(std::filesystem::exists(file), "{} cannot resume a torch::optim::Optimizer: it has no {}", dir.string(),
          file.filename().string());
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(file.string());
      wrapped->load(archive);
    } catch (const c10::Error& e) {
      fail("{}: torch could not load the optimizer state: {}", file.string(), e.what_without_backtrace());
    }
  } else {
    optimizer.optimizer().load_state(optimizer_state_for_this_rank(dir, optimizer, stem), meta);
  }
}

LOOM_INLINE void Checkpointer::load(const std::filesystem::path& dir, TrainerState& state,
                                    const std::vector<OptimizerStep*>& optimizers, const std::vector<JsonPart>& parts) {
  log_message(LogLevel::info, "loading model from {}", dir.string());
  // The weights first: a damaged model file is the most useful thing to report.
  load_weights(dir);
  std::vector<std::string> required;
  for (std::size_t k = 0; k < optimizers.size(); ++k) required.push_back(optimizer_file_stem(k) + ".json");
  for (const auto& part : parts) required.push_back(part.file);
  required.emplace_back(detail::kRngState);
  for (const auto& f : required)
    check(std::filesystem::exists(dir / f),
          "{} cannot resume training: it has no {} (saved with save_only_model? then start from its "
          "weights with --model_name_or_path {})", dir.string(), f, dir.string());
  for (std::size_t k = 0; k < optimizers.size(); ++k) load_optimizer(dir, *optimizers[k], optimizer_file_stem(k));
  for (const auto& part : parts) {
    const auto file = dir / part.file;
    const auto j = json::read_file(file);
    try {
      part.load(j);
    } catch (const Error& e) {
      detail::rethrow_with_path(file, e);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: {}", file.string(), e.what());
    }
  }
  for (const auto& entry : checkpoint::load_safetensors(dir / detail::kRngState)) {
    const std::string& name = entry.first;
    auto restore = [&state = entry.second](at::Generator gen) {  // a handle sharing the global generator
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    };
    if (name == "cpu") {
      restore(at::detail::getDefaultCPUGenerator());
    } else if (name.rfind("cuda:", 0) == 0 && torch::cuda::is_available()) {
      const int i = std::stoi(name.substr(5));
      if (i < static_cast<int>(torch::cuda::device_count()))
        restore(at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, i)));
    }
  }
  // Progress, history and best model come from the checkpoint; the plan (max_steps,
  // intervals) from this run's arguments, as HF does.
  const auto saved = TrainerState::load(dir / checkpoint::kTrainerStateFile);
  state.global_step = saved.global_step;
  state.epoch = saved.epoch;
  state.log_history = saved.log_history;
  state.best_metric = saved.best_metric;
  state.best_global_step = saved.best_global_step;
  state.best_model_checkpoint = saved.best_model_checkpoint;
  state.total_flos = saved.total_flos;
  state.num_input_tokens_seen = saved.num_input_tokens_seen;
  state.stateful_callbacks = saved.stateful_callbacks;
}

LOOM_INLINE bool Checkpointer::shard_holds_pieces(const std::filesystem::path& meta_file, OptimizerStep& optimizer) {
  // Anything unexpected (a missing or malformed file) is reported by the path that reads every shard.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(meta_file, ec)) return false;
  try {
    const auto meta = json::read_file(meta_file);
    if (!meta.is_object() || !meta.contains("ranges") || !meta["ranges"].is_object()) return false;
    const auto& ranges = meta["ranges"];
    const auto& pieces = optimizer.pieces();
    if (ranges.size() != pieces.size()) return false;
    for (const auto& p : pieces) {
      const auto it = ranges.find(p.name);
      if (it == ranges.end() || *it != nlohmann::json{p.begin, p.end, p.numel}) return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The optimizer state of checkpoint `dir`, whole or sharded at any world size, cut to what
// this rank's optimizer steps (whole parameters, or this rank's pieces).
LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> Checkpointer::optimizer_state_for_this_rank(
    const std::filesystem::path& dir, OptimizerStep& optimizer, const std::string& stem) {
  std::map<std::string, torch::Tensor> full;
  const auto whole_file = dir / (stem + ".safetensors");
  // The shape each moment was saved with, checked against its parameter's below (a moment
  // with the right element count in another layout must not load flattened).
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> saved_shape;  // key -> (shape, file)
  if (std::filesystem::exists(whole_file)) {
    for (auto& [k, t] : checkpoint::load_safetensors(whole_file)) {
      const bool shaped = optim::is_param_shaped(k.substr(0, k.find('.')));
      if (shaped) saved_shape[k] = {t.sizes().vec(), whole_file.string()};
      full[k] = shaped ? t.reshape({-1}) : t;
    }
  } else {
    // The world size the checkpoint was saved at, from any shard's name (a node's own folder
    // holds only its ranks' shards under save_on_each_node).
    int64_t world = 0;
    const std::regex shard_name(stem + R"(-[0-9]{1,6}-of-([1-9][0-9]{0,5})\.safetensors)");
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::smatch m;
      const auto name = e.path().filename().string();
      if (!std::regex_match(name, m, shard_name)) continue;
      const int64_t n = std::stoll(m[1].str());
      check(world == 0 || world == n, "{} holds optimizer shards of two world sizes ({} and {})", dir.string(), world, n);
      world = n;
    }
    check(world > 0,
          "{} cannot resume training: it has neither {}.safetensors nor {}-R-of-N.safetensors "
          "(saved with save_only_model? then start from its weights with --model_name_or_path {})",
          dir.string(), stem, stem, dir.string());
    // At the world size of the save under the same partition (policy and buckets), this rank's
    // own shard holds exactly its pieces: it is the one file read, the coverage is its own.
    const bool own_only = engine_->shards_optimizer() && world == world_.size &&
                          shard_holds_pieces(dir / fmt::format("{}-{}-of-{}.json", stem, world_.rank, world), optimizer);
    std::map<std::string, int64_t> covered, numels;
    for (int64_t r = own_only ? world_.rank : 0; r < (own_only ? world_.rank + 1 : world); ++r) {
      const auto shard = dir / fmt::format("{}-{}-of-{}", stem, r, world);
      check(std::filesystem::exists(shard.string() + ".safetensors") && std::filesystem::exists(shard.string() + ".json"),
            "{} is missing the optimizer shard of rank {} ({}.safetensors/.json) of the {} it was saved at; a "
            "checkpoint each node saved in its own folder (save_on_each_node) holds only that node's ranks' shards: "
            "resume it at {} processes under the same sharding policy, or gather every node's shards into one folder",
            dir.string(), r, shard.filename().string(), world, world);
      const std::string meta_file = shard.string() + ".json";
      const auto meta = json::read_file(meta_file);
      const json::Fields fields(meta, meta_file);
      const auto& ranges = fields.object("ranges");
      const nlohmann::json no_shapes = nlohmann::json::object();
      const auto& shapes = fields.has("shapes") ? fields.object("shapes") : no_shapes;  // absent before 2026-11-23
      for (auto& [key, t] : checkpoint::load_safetensors(shard.string() + ".safetensors")) {
        const auto dot = key.find('.');
        const std::string kind = key.substr(0, dot), param = key.substr(dot + 1);
        if (!optim::is_param_shaped(kind)) {
          full[key] = t;
          continue;
        }
        check(ranges.contains(param), "{}: field 'ranges' has no entry for {}", meta_file, param);
        const auto& range = ranges[param];
        const bool valid = range.is_array() && range.size() == 3 &&
                           std::all_of(range.begin(), range.end(), [](const auto& x) { return x.is_number_integer(); });
        const int64_t begin = valid ? range[0].template get<int64_t>() : 0, end = valid ? range[1].template get<int64_t>() : 0,
                      numel = valid ? range[2].template get<int64_t>() : 0;
        check(valid && 0 <= begin && begin <= end && end <= numel && end - begin == t.numel(),
              "{}: field 'ranges.{}' must be [begin, end, numel] with 0 <= begin <= end <= numel and end - begin = "
              "the {} elements of {} in the shard, got {}", meta_file, param, t.numel(), key, range.dump());
        const auto seen = numels.find(key);
        check(seen == numels.end() || seen->second == numel, "{}: field 'ranges.{}' gives {} elements, another shard {}",
              meta_file, param, numel, seen == numels.end() ? 0 : seen->second);
        if (shapes.contains(param)) {
          const auto& shape = shapes[param];
          check(shape.is_array() && std::all_of(shape.begin(), shape.end(), [](const auto& x) { return x.is_number_unsigned(); }),
                "{}: field 'shapes.{}' must be a list of sizes, got {}", meta_file, param, shape.dump());
          saved_shape[key] = {shape.template get<std::vector<int64_t>>(), meta_file};
        }
        auto& f = full[key];
        if (!f.defined()) f = torch::zeros({numel}, t.options());
        f.narrow(0, begin, end - begin).copy_(t.reshape({-1}));
        covered[key] += end - begin;
        numels[key] = numel;
      }
    }
    for (const auto& [key, n] : numels)
      check(own_only || covered[key] == n, "{}: the optimizer shards cover {} of the {} elements of {}", dir.string(), covered[key],
            n, key);
  }
  const auto param_shape = parameter_shapes();
  for (const auto& [key, saved] : saved_shape) {
    const auto it = param_shape.find(key.substr(key.find('.') + 1));
    if (it == param_shape.end()) continue;  // Optimizer::load_state reports it as unexpected
    check(saved.first == it->second, "{}: the optimizer state {} has shape {} but parameter {} has shape {}",
          saved.second, key, checkpoint::detail::shape_string(saved.first), it->first,
          checkpoint::detail::shape_string(it->second));
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  // The state keys ("<kind>.<param>") of each parameter; what is missing Optimizer::load_state reports.
  std::map<std::string, std::vector<std::string>> keys_of;
  for (const auto& [key, t] : full) keys_of[key.substr(key.find('.') + 1)].push_back(key);
  auto take = [&](const std::string& key, int64_t begin, int64_t end, c10::IntArrayRef shape) {
    auto it = full.find(key);
    if (!optim::is_param_shaped(key.substr(0, key.find('.')))) out.emplace_back(key, it->second);
    else if (it->second.numel() < end) out.emplace_back(key, it->second);  // a shape mismatch, reported there
    else out.emplace_back(key, it->second.narrow(0, begin, end - begin).reshape(shape));
  };
  auto& opt = optimizer.optimizer();
  const bool pieces = engine_->shards_optimizer();
  std::size_t k = 0;
  for (const auto& g : opt.groups())
    for (std::size_t i = 0; i < g.params.size(); ++i, ++k) {
      const auto& name = g.names.at(i);
      const int64_t begin = pieces ? optimizer.pieces().at(k).begin : 0;
      const int64_t end = pieces ? optimizer.pieces().at(k).end : g.params[i].numel();
      if (auto keys = keys_of.find(name); keys != keys_of.end())
        for (const auto& key : keys->second) take(key, begin, end, g.params[i].sizes());
    }
  if (full.empty()) out.clear();
  return out;
}

LOOM_INLINE std::optional<std::filesystem::path> detect_last_checkpoint(const TrainingArguments& args) {
  const std::filesystem::path out(args.output_dir);
  if (!args.do_train || args.overwrite_output_dir || !path_exists(out, PathKind::folder, "--output_dir")) return std::nullopt;
  auto last = checkpoint::latest_checkpoint(out);
  if (!last) {
    // The run lock of a run that ended without removing it (a killed process), or a node's mark
    // of another process starting up beside this one (claim_output_dir), is not content.
    const bool empty = std::all_of(std::filesystem::directory_iterator(out), std::filesystem::directory_iterator(),
                                   [](const auto& e) {
                                     const auto name = e.path().filename().string();
                                     return name == checkpoint::kLockFile || name.rfind(checkpoint::kNodeMarkPrefix, 0) == 0;
                                   });
    check(empty,
          "output directory {} already exists and is not empty; use --overwrite_output_dir to train in it from "
          "scratch", out.string());
    return std::nullopt;
  }
  if (args.resume_from_checkpoint) return std::nullopt;
  return last;
}

}  // namespace loom
