#pragma once
// The base a LoRA run's adapters are trained on, when the run draws it at random: saved as
// <output_dir>/base (an HF folder) and named by every adapter_config.json the run writes, so
// peft.PeftModel.from_pretrained finds it. Three rules keep the adapters on their base:
//   - a resumed run continues on the base its checkpoint's adapter names (not on a fresh
//     draw); a base that is missing is an error, and so is --model_name_or_path naming another;
//   - a fresh run never replaces a base/ already there (earlier checkpoints were trained on it);
//   - the new base is written aside and put in place only once the Trainer has accepted the
//     run, so a start that fails leaves output_dir as it was.

#include <loom/checkpoint/folders.hpp>
#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/peft/lora.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace saved_base {

/// The checkpoint a run resumes from: --resume_from_checkpoint's folder, or with "latest" the
/// newest complete checkpoint-N of output_dir; none without the flag.
inline std::optional<std::filesystem::path> resumed_checkpoint(const loom::TrainingArguments& args) {
  if (!args.resume_from_checkpoint) return std::nullopt;
  if (*args.resume_from_checkpoint != "latest") return std::filesystem::path(*args.resume_from_checkpoint);
  const std::filesystem::path out(args.output_dir);
  auto last = std::filesystem::is_directory(out) ? loom::checkpoint::latest_checkpoint(out) : std::nullopt;
  loom::check(last.has_value(), "--resume_from_checkpoint latest: no complete checkpoint-N folder in {}",
              out.string());
  return last;
}

/// The base the adapter saved in `checkpoint` names (adapter_config.json's
/// base_model_name_or_path); none when there is no adapter or it names none.
inline std::optional<std::string> adapter_base(const std::filesystem::path& checkpoint) {
  const auto file = checkpoint / loom::peft::adapter_config_file;
  if (!loom::path_exists(file, loom::PathKind::file)) return std::nullopt;
  const auto j = loom::json::read_file(file);
  loom::check(j.is_object(), "{}: not a JSON object", file.string());
  const auto it = j.find("base_model_name_or_path");
  if (it == j.end() || it->is_null()) return std::nullopt;
  loom::check(it->is_string(), "{}: base_model_name_or_path must be a string, got {}", file.string(), it->dump());
  return it->get<std::string>();
}

/// True when the two paths name the same folder (or, when either is missing, the same text).
inline bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec)) return std::filesystem::equivalent(a, b, ec);
  return std::filesystem::path(a).lexically_normal() == std::filesystem::path(b).lexically_normal();
}

/// What a training run does about its base, decided before anything is read or written.
struct Plan {
  std::optional<std::string> resumed_base;  ///< the folder the resumed adapter names: load the base from it
  bool save_random_base = false;            ///< a fresh run on a random base: save it as `saved_base`
};

/// The plan for a run with `lora` (an adapter on a frozen base) whose random base would be
/// `saved_base`; every refusal is a loom::Error naming the folders.
inline Plan plan(const loom::TrainingArguments& args, bool lora, const std::filesystem::path& saved_base) {
  Plan p;
  if (!lora || !args.do_train) return p;
  if (const auto checkpoint = resumed_checkpoint(args)) {
    const auto named = adapter_base(*checkpoint);
    loom::check(named.has_value(),
                "--resume_from_checkpoint {}: it holds no adapter_config.json naming the base its adapter was trained "
                "on, so this LoRA run cannot tell which base to continue on",
                checkpoint->string());
    if (args.model_name_or_path) {
      loom::check(same_folder(*args.model_name_or_path, *named),
                  "--model_name_or_path {} is not the base the adapter in {} was trained on ({}); resume on that base, "
                  "or start afresh in another --output_dir",
                  *args.model_name_or_path, checkpoint->string(), *named);
    } else {
      loom::check(loom::path_exists(std::filesystem::path(*named) / "config.json", loom::PathKind::file),
                  "the adapter in {} was trained on the base in {}, which is missing (no config.json there); a new "
                  "random base would not be the one it learned on: restore that folder, or start afresh in another "
                  "--output_dir",
                  checkpoint->string(), *named);
      p.resumed_base = *named;
    }
    return p;
  }
  if (!args.model_name_or_path) {
    loom::check(!std::filesystem::exists(saved_base),
                "{} holds the random base an earlier run's adapters were trained on, and a new run would replace it: "
                "resume that run (--resume_from_checkpoint latest), or remove the folder or pick another --output_dir "
                "to start afresh",
                saved_base.string());
    p.save_random_base = true;
  }
  return p;
}

/// A model saved beside its final place (`target` with a `.staging` suffix) until commit()
/// renames it there; destroyed uncommitted (a start that failed), it removes what it wrote,
/// and output_dir too when it made it and nothing else is in it.
class Staged {
 public:
  template <class Model>
  Staged(Model& model, std::filesystem::path target)
      : target_(std::move(target)),
        staging_(target_.parent_path() / ("." + target_.filename().string() + ".staging")),
        made_parent_(!std::filesystem::exists(target_.parent_path())) {
    std::filesystem::remove_all(staging_);  // a staging folder a killed start left
    model->save_pretrained(staging_);
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  ~Staged() {
    if (committed_) return;
    std::error_code ec;
    std::filesystem::remove_all(staging_, ec);
    if (made_parent_ && std::filesystem::is_empty(target_.parent_path(), ec)) std::filesystem::remove(target_.parent_path(), ec);
  }
  /// Puts the model in its place.
  void commit() {
    if (committed_) return;
    std::filesystem::rename(staging_, target_);
    committed_ = true;
  }

 private:
  std::filesystem::path target_, staging_;
  bool made_parent_;
  bool committed_ = false;
};

}  // namespace saved_base
