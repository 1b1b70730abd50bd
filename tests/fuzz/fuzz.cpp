// libFuzzer harnesses for loom's input parsers, one binary for all (compiling the torch
// headers is slow). LOOM_FUZZ_TARGET picks the harness, read once per process:
//   safetensors       the input is a .safetensors file: load_safetensors + load_safetensors_metadata
//   state_json        the input is trainer_state.json text: TrainerState::from_json, TrainerControl::from_state
//   parse_args        the input is argv split on '\0': try_parse_args<TrainingArguments>, validate, finalize
//   scheduler_kwargs  byte 0 picks lr_scheduler_type, the rest is --lr_scheduler_kwargs:
//                     validate, make_schedule_params, LRScheduler<FromArgs>, current_lr/step
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
#include <loom/schedule/from_args.hpp>

#include <torch/torch.h>

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
#include <typeinfo>
#include <unistd.h>
#include <vector>

namespace {

enum class Target { safetensors, state_json, parse_args, scheduler_kwargs };

Target g_target = Target::safetensors;
std::filesystem::path g_file;  // the safetensors harness's one file per process

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
  } else {
    std::fprintf(stderr,
                 "loom fuzz: set LOOM_FUZZ_TARGET to safetensors, state_json, parse_args or scheduler_kwargs\n");
    std::exit(2);
  }
  torch::set_num_threads(1);
  const char* shm = "/dev/shm";
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir = std::filesystem::is_directory(shm) ? shm : (tmp ? tmp : "/tmp");
  g_file = dir / ("loom_fuzz_" + std::to_string(::getpid()) + ".safetensors");
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove(g_file, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  switch (g_target) {
    case Target::safetensors: fuzz_safetensors(data, size); break;
    case Target::state_json: fuzz_state_json(data, size); break;
    case Target::parse_args: fuzz_parse_args(data, size); break;
    case Target::scheduler_kwargs: fuzz_scheduler_kwargs(data, size); break;
  }
  return 0;
}
