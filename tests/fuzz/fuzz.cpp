// libFuzzer harnesses for loom's input parsers, one binary for all (compiling the torch
// headers is slow). LOOM_FUZZ_TARGET picks the harness, read once per process:
//   safetensors       the input is a .safetensors file: load_safetensors + load_safetensors_metadata
//   state_json        the input is trainer_state.json text: TrainerState::from_json, TrainerControl::from_state
//   parse_args        the input is argv split on '\0': try_parse_args<TrainingArguments>, validate, finalize
//   scheduler_kwargs  byte 0 picks lr_scheduler_type, the rest is --lr_scheduler_kwargs:
//                     validate, make_schedule_params, LRScheduler<FromArgs>, current_lr/step
//   hf_config         byte 0 picks the family (GPT-2, BERT, Llama), the rest is config.json:
//                     read_hf_config, complete_config, validate, config_shapes, hf_config_json;
//                     the rest also as adapter_config.json: lora_config_from_json
//   token_meta        the input is a data folder's meta.json: read_token_meta and its files' names
//   token_files       the input is a ragged token file cut in four by its first bytes (ids,
//                     offsets, labels, loss mask): TokenSequenceDataset (class ids per example and
//                     per token, multi-hot and regression float32 rows) and SftDataset (padded and
//                     packed), every row read
// Only loom::Error may leave loom; any other exception aborts (a finding), as do crashes and
// sanitizer reports. Build and run: `make fuzz` (tests/fuzz/README.md).
// Header-only mode on purpose: LOOM_SEPARATE_COMPILATION is not defined, so the .ipp bodies
// are compiled here with the sanitizers and coverage instrumentation.
#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/state.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/sft.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora.hpp>
#include <loom/schedule/from_args.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <unistd.h>
#include <vector>

namespace {

enum class Target { safetensors, state_json, parse_args, scheduler_kwargs, hf_config, token_meta, token_files };

Target g_target = Target::safetensors;
std::filesystem::path g_file;  // the safetensors harness's one file per process
std::filesystem::path g_dir;   // the folder harnesses' one folder per process

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "loom fuzz: %s\n", what);
  std::abort();
}

// Anything but loom::Error escaping a harness is a finding: abort so libFuzzer records it.
template <class F>
void only_loom_errors(F&& f) {
  try {
    f();
  } catch (const loom::Error&) {
    // expected: loom's documented error type
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom fuzz: non-loom exception escaped: %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    die("non-std exception escaped");
  }
}

void fuzz_safetensors(const uint8_t* data, size_t size) {
  {
    std::ofstream out(g_file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) die("cannot write the input file");
  }
  only_loom_errors([] {
    auto tensors = loom::checkpoint::load_safetensors(g_file);
    // Touch every tensor so a wrong size/stride would be read by ASan-visible code.
    for (auto& [name, t] : tensors) {
      if (t.defined() && t.numel() > 0) (void)t.to(torch::kDouble).sum().item<double>();
    }
  });
  only_loom_errors([] { (void)loom::checkpoint::load_safetensors_metadata(g_file); });
}

void fuzz_state_json(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  only_loom_errors([&] {
    const nlohmann::json j = loom::json::parse(text, "fuzz");
    only_loom_errors([&] {
      const loom::TrainerState state = loom::TrainerState::from_json(j, "fuzz");
      (void)state.to_json().dump();
    });
    only_loom_errors([&] { (void)loom::TrainerControl::from_state(j); });
    // The entry where loom/HF keep it: stateful_callbacks.TrainerControl.
    if (j.is_object()) {
      const auto callbacks = j.find("stateful_callbacks");
      if (callbacks != j.end() && callbacks->is_object()) {
        const auto control = callbacks->find("TrainerControl");
        if (control != callbacks->end()) only_loom_errors([&] { (void)loom::TrainerControl::from_state(*control); });
      }
    }
  });
}

void fuzz_parse_args(const uint8_t* data, size_t size) {
  std::vector<std::string> argv;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      argv.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty() || argv.empty()) argv.push_back(std::move(current));
  only_loom_errors([&] {
    auto result = loom::try_parse_args<loom::TrainingArguments>(std::span<const std::string>(argv));
    if (result.help) return;
    loom::TrainingArguments args = std::get<0>(std::move(result.values));
    loom::validate(args);  // copes with arguments that were not finalized
    loom::finalize(args);
    loom::validate(args);
  });
}

// HF's SchedulerType names, in loom::schedule::NamedSchedules order (schedule/from_args.hpp).
constexpr std::array<const char*, 11> kSchedulers = {
    "linear",       "cosine",       "cosine_with_restarts", "polynomial",         "constant",
    "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr",
    "cosine_warmup_with_min_lr", "warmup_stable_decay"};

void fuzz_scheduler_kwargs(const uint8_t* data, size_t size) {
  if (size == 0) return;
  loom::TrainingArguments args;
  args.lr_scheduler_type = kSchedulers[data[0] % kSchedulers.size()];
  args.lr_scheduler_kwargs.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  // The rest of byte 0 (byte / 11, mod 24) sets warmup_steps, so warmup-dependent paths are reached.
  if (size > 1) args.warmup_steps = static_cast<double>((data[0] / kSchedulers.size()) % 24);
  only_loom_errors([&] {
    loom::validate(args);
    const loom::schedule::ScheduleParams params = loom::schedule::make_schedule_params(args, 100);
    loom::schedule::LRScheduler<loom::schedule::FromArgs> scheduler(params, args.lr_scheduler_type);
    for (int i = 0; i < 8; ++i) {
      (void)scheduler.current_lr();
      if (scheduler.wants_metric()) scheduler.step_metric(1.0 / (i + 1));
      scheduler.step();
    }
    (void)scheduler.lr_at(100);
    (void)scheduler.lr_at(1000);
  });
}

void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) die("cannot write an input file");
}

template <class Config>
void read_config() {
  only_loom_errors([] {
    auto config = loom::models::read_hf_config<Config>(g_dir);
    if constexpr (requires { loom::models::complete_config(config); }) loom::models::complete_config(config);
    if constexpr (std::is_same_v<Config, loom::models::BertConfig>)
      loom::models::BertForSequenceClassificationImpl::complete_config(config);
    loom::models::validate(config, "fuzz");
    for (const auto& shape : loom::models::config_shapes(config)) (void)shape;
    (void)loom::models::hf_config_json(config, "Fuzz").dump();
  });
}

void fuzz_hf_config(const uint8_t* data, size_t size) {
  if (size == 0) return;
  write_file(g_dir / "config.json", data + 1, size - 1);
  switch (data[0] % 3) {
    case 0: read_config<loom::models::GPT2Config>(); break;
    case 1: read_config<loom::models::BertConfig>(); break;
    default: read_config<loom::models::LlamaConfig>(); break;
  }
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  only_loom_errors([&] { (void)loom::peft::lora_config_from_json(loom::json::parse(text, "fuzz"), "fuzz"); });
}

void fuzz_token_meta(const uint8_t* data, size_t size) {
  write_file(g_dir / "meta.json", data, size);
  only_loom_errors([] {
    const auto meta = loom::data::read_token_meta(g_dir / "meta.json");
    for (const auto& [split, file] : meta.lm) (void)meta.lm_file(split);
    for (const auto& [split, files] : meta.sft) (void)meta.sft_files(split);
    for (const auto& [split, files] : meta.classification) (void)meta.classification_files(split);
    (void)meta.sequence_options(16);
  });
}

// Every row of `dataset`, one batch at a time.
template <class D, class Read>
void read_rows(const D& dataset, Read read) {
  for (int64_t i = 0; i < dataset.size() && i < 64; ++i) read(i);
}

void fuzz_token_files(const uint8_t* data, size_t size) {
  // Bytes 0-5: the sizes of the first three parts (16 bits each); the rest is the mask.
  if (size < 6) return;
  size_t at = 6, part[3];
  for (int k = 0; k < 3; ++k) part[k] = static_cast<size_t>(data[2 * k]) | static_cast<size_t>(data[2 * k + 1]) << 8;
  const char* names[] = {"ids.bin", "ids.offsets", "ids.labels", "ids.mask"};
  for (int k = 0; k < 4; ++k) {
    const size_t n = k < 3 ? std::min(part[k], size - at) : size - at;
    write_file(g_dir / names[k], data + at, n);
    at += n;
  }
  const loom::data::RaggedTokenFiles ragged{g_dir / names[0], g_dir / names[1], g_dir / names[2]};
  // Class ids per example and per token, multi-hot rows and regression targets (float32).
  using loom::data::LabelKind;
  for (const auto& [per_token, kind] : {std::pair{false, LabelKind::class_id}, std::pair{true, LabelKind::class_id},
                                        std::pair{false, LabelKind::multi_hot}, std::pair{false, LabelKind::regression}}) {
    only_loom_errors([&, per_token = per_token, kind = kind] {
      loom::data::TokenSequenceOptions options;
      options.max_length = 8;
      options.vocab_size = 300;
      options.labels_per_token = per_token;
      options.label_kind = kind;
      options.num_labels = kind == LabelKind::class_id ? 5 : 3;
      const loom::data::TokenSequenceDataset d(ragged, options);
      read_rows(d, [&](int64_t i) {
        const std::vector<int64_t> rows{i};
        only_loom_errors([&] { (void)d.collate({d.get(rows.front())}); });
      });
    });
  }
  const loom::data::SftFiles sft{g_dir / names[0], g_dir / names[1], g_dir / names[3]};
  for (const int64_t packing : {0, 6}) {
    only_loom_errors([&] {
      loom::data::SftOptions options;
      options.vocab_size = 300;
      options.max_length = 8;
      if (packing > 0) options.packing = packing;
      const loom::data::SftDataset d(sft, options);
      read_rows(d, [&](int64_t i) {
        const std::vector<int64_t> rows{i};
        const auto b = d.get_batch(rows);
        (void)b.labels.sum().item<int64_t>();
      });
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("LOOM_FUZZ_TARGET");
  const std::string_view t = name ? name : "";
  if (t == "safetensors") {
    g_target = Target::safetensors;
  } else if (t == "state_json") {
    g_target = Target::state_json;
  } else if (t == "parse_args") {
    g_target = Target::parse_args;
  } else if (t == "scheduler_kwargs") {
    g_target = Target::scheduler_kwargs;
  } else if (t == "hf_config") {
    g_target = Target::hf_config;
  } else if (t == "token_meta") {
    g_target = Target::token_meta;
  } else if (t == "token_files") {
    g_target = Target::token_files;
  } else {
    std::fprintf(stderr, "loom fuzz: set LOOM_FUZZ_TARGET to safetensors, state_json, parse_args, scheduler_kwargs, "
                         "hf_config, token_meta or token_files\n");
    std::exit(2);
  }
  torch::set_num_threads(1);
  const char* shm = "/dev/shm";
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir = std::filesystem::is_directory(shm) ? shm : (tmp ? tmp : "/tmp");
  g_file = dir / ("loom_fuzz_" + std::to_string(::getpid()) + ".safetensors");
  g_dir = dir / ("loom_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(g_dir);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove(g_file, ec);
    std::filesystem::remove_all(g_dir, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  switch (g_target) {
    case Target::safetensors: fuzz_safetensors(data, size); break;
    case Target::state_json: fuzz_state_json(data, size); break;
    case Target::parse_args: fuzz_parse_args(data, size); break;
    case Target::scheduler_kwargs: fuzz_scheduler_kwargs(data, size); break;
    case Target::hf_config: fuzz_hf_config(data, size); break;
    case Target::token_meta: fuzz_token_meta(data, size); break;
    case Target::token_files: fuzz_token_files(data, size); break;
  }
  return 0;
}
