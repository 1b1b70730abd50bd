#pragma once
#include <loom/checkpoint/folders.hpp>
#include <loom/config/launcher_configs.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/device.hpp>
#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/accelerate/startup.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

LOOM_INLINE std::string resolved_sharding(const TrainingArguments& given) {
  std::optional<TrainingArguments> copy;
  if (!given.given.launcher_configs_applied()) apply_launcher_configs(copy.emplace(given));  // not finalized yet
  const TrainingArguments& args = copy ? *copy : given;
  if (args.sharding != detail::kAutoSharding) return args.sharding;
  return std::string(dist::world_from_env().size > 1 ? sharding::DDP::name : sharding::NoShard::name);
}

LOOM_INLINE ShardingFacts sharding_chosen(const TrainingArguments& args) {
  const std::string name = resolved_sharding(args);
  ShardingFacts facts;
  if (!visit_member<ShardingCatalog>(name, [&]<class Tag>() { facts = Tag::facts; }))
    fail("--sharding {} is not one of {}|{}", name, joined_names<ShardingCatalog>("|"), detail::kAutoSharding);
  return facts;
}

LOOM_INLINE PrecisionFacts precision_chosen(const TrainingArguments& args) {
  const std::string_view name = detail::precision_member_chosen(args);
  PrecisionFacts facts;
  if (!visit_member<PrecisionCatalog>(name, [&]<class Tag>() { facts = Tag::facts; }))
    fail("no precision policy is called {}", name);
  return facts;
}

LOOM_INLINE Startup start_up(TrainingArguments& args, const CompiledPolicies& policies, bool has_eval_dataset) {
  // The precision policy named in the type decides; its flag (--bf16 / --fp16) must agree with
  // it (the runtime selector, loom::select_policies, picks the type from those flags).
  const std::string_view set = detail::precision_flag_chosen(args);
  if (!set.empty() && set != policies.precision.name) {
    std::string_view wanted;
    visit_member<PrecisionCatalog>(set, [&]<class Tag>() { wanted = Tag::facts.type_name; });
    fail("--{} is set but this Trainer was compiled with precision::{}; name precision::{} or precision::FromArgs in its "
         "type, or build it through loom::select_policies", set, policies.precision.type_name, wanted);
  }
  // An explicit `--bf16 false` for a Trainer compiled with BF16 disagrees as well (the parser
  // records which flags were given: TrainingArguments::given).
  if (policies.precision.has_flag && args.given.contains(policies.precision.name) && set.empty())
    fail("--{} false disagrees with this Trainer's compiled precision::{}; drop the flag, or name "
         "precision::FromArgs in the Trainer's type", policies.precision.name, policies.precision.type_name);
  for_each_member<PrecisionCatalog>([&]<class Tag>() {
    if constexpr (Tag::facts.has_flag) *detail::bool_field(args, Tag::facts.name) = Tag::facts.name == policies.precision.name;
  });
  // --sharding and --lr_scheduler_type: a flag left out takes the compiled policy; a flag given
  // with another value was meant for another Trainer type. "Left out": not among the flags the
  // parser recorded and at its default (arguments built in code record nothing). --sharding
  // auto, given or not, leaves the choice to the program (select_policies resolves it).
  const TrainingArguments defaults;
  if (args.sharding == defaults.sharding) args.sharding = std::string(policies.sharding.name);
  check(args.sharding == policies.sharding.name,
        "--sharding {} is not available in this build; the Trainer's sharding policy is \"{}\" (name it or "
        "sharding::FromArgs in the Trainer's type, or build it through loom::select_policies)", args.sharding,
        policies.sharding.name);
  // A schedule tag outside HF's names (a user's own) is written back after validation, which
  // checks --lr_scheduler_type against HF's names.
  bool custom_schedule = false;
  if (!policies.schedule.empty()) {
    const bool given = args.given.contains("lr_scheduler_type") || args.lr_scheduler_type != defaults.lr_scheduler_type;
    check(!given || args.lr_scheduler_type == policies.schedule,
          "--lr_scheduler_type {} disagrees with the Trainer's compiled schedule \"{}\"; drop the flag, or name "
          "loom::schedule::FromArgs (the default) in the Trainer's type to choose the schedule by flag",
          args.lr_scheduler_type, policies.schedule);
    custom_schedule = std::ranges::find(detail::kLrSchedulerTypes, policies.schedule) == detail::kLrSchedulerTypes.end();
    if (!custom_schedule) args.lr_scheduler_type = std::string(policies.schedule);
  }
  apply_launcher_configs(args);  // --deepspeed / --fsdp read once, here or by the program before
  validate(args);
  finalize(args);
  if (custom_schedule) args.lr_scheduler_type = std::string(policies.schedule);
  check(args.eval_strategy == "no" || has_eval_dataset,
        "--eval_strategy {} needs an evaluation dataset; pass one to the Trainer or use --eval_strategy no",
        args.eval_strategy);
  Startup s;
  s.world = dist::world_from_env();
  set_log_level(process_log_level(args, s.world.logs(args.log_on_each_node)));
  if (const auto& ignored = args.given.ignored(); !ignored.empty()) {
    std::string names;
    for (const auto& name : ignored) names += (names.empty() ? "" : ", ") + name;
    log_message(LogLevel::info, "transformers settings read at values loom already honours, with no flag of loom's: {}",
                names);
  }
  dist::check_sharding(policies.sharding.name, args, s.world);
  // An out-of-memory error on one rank would leave the others waiting in a collective.
  check(!args.auto_find_batch_size || s.world.size == 1,
        "--auto_find_batch_size runs in a single process: under WORLD_SIZE {} an out-of-memory error on one rank "
        "would leave the others waiting in a collective; find the batch size in one process, then pass it as "
        "--per_device_train_batch_size", s.world.size);
  if (torch::cuda::is_available() && !args.use_cpu) {
    check(s.world.local_rank < static_cast<int>(torch::cuda::device_count()),
          "LOCAL_RANK {} has no GPU: this node has {}; start at most that many processes per node",
          s.world.local_rank, torch::cuda::device_count());
    s.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(s.world.local_rank));
    make_current(s.device);  // else every rank's first context and pinned memory land on GPU 0
  }
  // HF's --tf32: TF32 tensor-core math for float32 matrix multiplies and convolutions
  // (unset: torch's own setting stays).
  if (args.tf32) {
    check(!*args.tf32 || s.device.is_cuda(),
          "--tf32 true needs a CUDA GPU (TF32 is a tensor-core format of Ampere and newer); this process runs on "
          "the CPU");
    at::globalContext().setAllowTF32CuBLAS(*args.tf32);
    at::globalContext().setAllowTF32CuDNN(*args.tf32);
  }
  if (policies.sharding.uses_comm)
    s.comm = std::make_shared<dist::Comm>(s.world, s.device, std::chrono::seconds(args.ddp_timeout));
  s.saves = s.world.is_main();
  if (args.save_on_each_node && s.world.several_nodes() && s.comm)
    s.saves = checkpoint::claim_output_dir(args.output_dir, s.world.rank, s.world.is_local_main(),
                                           [&] { s.comm->barrier("the output folder probe"); });
  return s;
}

}  // namespace loom
