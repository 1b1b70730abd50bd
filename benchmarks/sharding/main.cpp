// benchmarks/sharding: the four sharding policies at 1, 2 and 4 processes on the CPU (Gloo).
//
//   build/benchmarks/sharding                 # the whole table (starts torchrun 12 times)
//   build/benchmarks/sharding --steps 30 --hidden 1024 --layers 4
//   build/benchmarks/sharding --worlds 2 --policies ddp --ddp_find_unused_parameters false
//   build/benchmarks/sharding --worlds 1,2 --policies ddp --probe_find_unused true
//   build/benchmarks/sharding --worlds 2 --bf16 true --sharding_param_dtype bf16 --sharding_reduce_dtype bf16
//
// The policy is a type: the worker is instantiated once per tag of the type list below and
// picks its instantiation by name. For each (policy, world size) the driver starts the
// workers with torchrun (--torchrun; `make bench` passes the project venv's) and prints, from rank 0:
//   * step time (median over the measured steps, after 3 warm-up steps),
//   * model-state bytes held by the rank (parameters + gradients + optimizer state) next to
//     the ZeRO paper's formula for the stage (fp32 master weights and AdamW: 16 bytes per
//     parameter for DDP, 4+4+8/N for ZeRO-1, 4+12/N for ZeRO-2, 16/N for FullShard),
//   * bytes this rank sent per step (ring algorithms: all-reduce 2(N-1)/N of the buffer,
//     reduce-scatter and all-gather (N-1)/N) next to the formula 2Ψ(N-1)/N for DDP, ZeRO-1
//     and ZeRO-2 and 3Ψ(N-1)/N for FullShard (Ψ = parameter bytes in float32), and its parts:
//     the parameter all-gathers and the gradient reductions (reduce-scatter or all-reduce).
//     --sharding_param_dtype (FullShard's gathers; the driver passes it to the policies that
//     gather parameters only) and --sharding_reduce_dtype scale the formula's terms by their
//     bytes per element over float32's (docs/distributed.md, "Mixed precision"); --bf16 runs
//     the workers under bfloat16 autocast (which --sharding_param_dtype bf16 needs),
//   * the process's peak resident memory (VmHWM);
//   * with --probe_find_unused, the median microseconds per step of what
//     --ddp_find_unused_parameters adds, timed on their own: the walk of the loss's autograd
//     graph with a lookup per parameter (done once more in compute_loss, its time taken out
//     of the step's) and an all-reduce of one int32 per parameter (after the step, once the
//     ranks are in step, as the bucket all-reduces leave them in the engine).

#include <loom/distributed/comm.hpp>
#include <loom/loom.hpp>
#include <loom/distributed/engine_common.hpp>  // graph_leaves, for --probe_find_unused

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

using PolicyList = std::tuple<loom::sharding::DDP, loom::sharding::ZeRO1, loom::sharding::ZeRO2, loom::sharding::FullShard>;

struct BenchArguments {
  std::string worker_policy = "";  ///< (internal) run as a worker of this policy
  std::string result = "";         ///< (internal) where the worker writes its figures
  int64_t steps = 20;              ///< optimizer steps per run (3 of them warm-up)
  int64_t hidden = 1024;           ///< width of the MLP
  int64_t layers = 4;              ///< hidden layers, one FullShard unit each
  int64_t batch = 32;              ///< per-device batch
  std::string torchrun = "torchrun";  ///< the launcher (`make bench` passes the project venv's)
  std::string worlds = "1,2,4";    ///< world sizes to run
  std::string policies = "ddp,zero1,zero2,full_shard";  ///< the policies to run, of those four
  bool probe_find_unused = false;  ///< also time, per step, what --ddp_find_unused_parameters adds: the graph walk and the used-flag all-reduce
};

struct Batch {
  torch::Tensor x;
  torch::Tensor labels;
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t hidden, int64_t layers) {
    input = register_module("input", loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(256, hidden)));
    for (int64_t i = 0; i < layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(hidden, hidden))));
    head = register_module("head", torch::nn::Linear(hidden, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(input->forward(x));
    for (auto& b : blocks) h = torch::relu(b->forward(h));
    return head->forward(h);
  }
  loom::FullShardUnit<torch::nn::Linear> input{nullptr};
  std::vector<loom::FullShardUnit<torch::nn::Linear>> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Mlp);

// Step durations, and the communication counters after the warm-up; with the probe on, the
// time of the graph walk (walk_us, added by compute_loss) and of a used-flag all-reduce.
struct StepClock {
  static constexpr int64_t kWarmup = 3;
  loom::dist::Comm* comm = nullptr;
  int64_t num_params = 0;  // > 0: the probe is on
  std::chrono::steady_clock::time_point begin;
  std::vector<double> ms, walk_us, mask_us;
  double walk_in_step_us = 0;
  void on_step_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    walk_in_step_us = 0;
    begin = std::chrono::steady_clock::now();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& state, loom::TrainerControl&) {
    const auto end = std::chrono::steady_clock::now();
    if (state.global_step > kWarmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(end - begin).count() - walk_in_step_us / 1000);
      if (num_params > 0) {
        walk_us.push_back(walk_in_step_us);
        // The engine's all-reduce follows the bucket all-reduces, which leave the ranks in step:
        // one all-reduce to get there, then the timed one.
        auto flags = torch::ones({num_params}, torch::kInt);
        if (comm != nullptr && comm->size() > 1) comm->all_reduce({flags.clone()}, "the probe all-reduce").wait();
        const auto t0 = std::chrono::steady_clock::now();
        if (comm != nullptr && comm->size() > 1) comm->all_reduce({flags}, "the probe all-reduce").wait();
        mask_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    if (state.global_step == kWarmup && comm != nullptr) comm->reset_counters();
  }
};

template <class Sharding, class Precision>
struct BenchTrainer : loom::Trainer<BenchTrainer<Sharding, Precision>, Mlp, Sharding, Precision, loom::Callbacks<StepClock>> {
  using loom::Trainer<BenchTrainer<Sharding, Precision>, Mlp, Sharding, Precision, loom::Callbacks<StepClock>>::Trainer;
  torch::Tensor compute_loss(Mlp& model, Batch& batch) {
    auto loss = torch::cross_entropy_loss(model->forward(batch.x), batch.labels);
    if (auto& clock = this->template callback<StepClock>(); clock.num_params > 0) {
      // What the bucket engine does before backward: the walk, then a lookup per parameter.
      const auto t0 = std::chrono::steady_clock::now();
      const auto reached = loom::dist::detail::graph_leaves(loss);
      int64_t found = 0;
      for (const auto& p : model->parameters()) found += reached.contains(p.unsafeGetTensorImpl()) ? 1 : 0;
      clock.walk_in_step_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      loom::check(found == clock.num_params, "the walk found {} of {} parameters", found, clock.num_params);
    }
    return loss;
  }
};

static double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0.0;
}

template <class Sharding, class Precision>
static void run_worker(const BenchArguments& b, const loom::TrainingArguments& args) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t rows = b.batch * 64;
  loom::data::TensorDataset<Batch> data({torch::randn({rows, 256}, gen), torch::randint(0, 10, {rows}, gen)});
  BenchTrainer<Sharding, Precision> trainer(args, Mlp(b.hidden, b.layers), data);
  trainer.template callback<StepClock>().comm = trainer.sharding().comm();
  if (b.probe_find_unused)
    trainer.template callback<StepClock>().num_params = static_cast<int64_t>(trainer.model()->parameters().size());
  trainer.train();
  if (!trainer.world().is_main()) return;
  auto ms = trainer.template callback<StepClock>().ms;
  std::sort(ms.begin(), ms.end());
  const auto* comm = trainer.sharding().comm();
  const double measured_steps = static_cast<double>(std::max<std::size_t>(ms.size(), 1));
  int64_t psi = 0;
  for (const auto& p : trainer.model()->parameters()) psi += p.numel();
  const auto bytes = trainer.model_state_bytes();
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const auto& clock = trainer.template callback<StepClock>();
  nlohmann::json j{{"step_ms", ms.empty() ? 0.0 : ms[ms.size() / 2]},
                   {"walk_us", median(clock.walk_us)},
                   {"mask_us", median(clock.mask_us)},
                   {"params", bytes.params},
                   {"grads", bytes.grads},
                   {"optimizer", bytes.optimizer},
                   {"psi", psi},
                   {"sent_per_step", comm ? comm->counters().total() / measured_steps : 0.0},
                   {"gathered_per_step", comm ? comm->counters().all_gather / measured_steps : 0.0},
                   {"reduced_per_step",
                    comm ? (comm->counters().reduce_scatter + comm->counters().all_reduce) / measured_steps : 0.0},
                   {"peak_rss", peak_rss_bytes()}};
  std::ofstream(b.result) << j.dump();
}

// Calls f.template operator()<Tag>() for the tag of PolicyList named `name`.
template <class F>
static bool with_policy(const std::string& name, F&& f) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((std::tuple_element_t<I, PolicyList>::name == name
                 ? (f.template operator()<std::tuple_element_t<I, PolicyList>>(), true)
                 : false) ||
            ...);
  }(std::make_index_sequence<std::tuple_size_v<PolicyList>>{});
}

int main(int argc, char** argv) {
  return loom::run_main([&] {
    loom::TrainingArguments defaults;
    defaults.use_cpu = true;
    defaults.disable_tqdm = true;
    defaults.logging_steps = 1000;
    defaults.save_strategy = "no";
    defaults.output_dir = "output/bench_sharding";
    defaults.skip_memory_metrics = true;
    auto [b, args] = loom::parse_args(argc, argv, BenchArguments{}, defaults);
    if (!b.worker_policy.empty()) {
      args.sharding = b.worker_policy;
      args.max_steps = b.steps;
      args.per_device_train_batch_size = b.batch;
      const bool known = with_policy(b.worker_policy, [&]<class Tag>() {
        if (args.bf16) run_worker<Tag, loom::precision::BF16>(b, args);
        else run_worker<Tag, loom::precision::FP32>(b, args);
      });
      loom::check(known, "unknown --worker_policy {}", b.worker_policy);
      return 0;
    }
    if (b.torchrun.find('/') == std::string::npos) {  // a bare name: the first on PATH
      const char* path = std::getenv("PATH");
      std::string dirs = path != nullptr ? path : "";
      for (std::size_t at = 0; at <= dirs.size();) {
        const std::size_t end = std::min(dirs.find(':', at), dirs.size());
        if (const fs::path p = fs::path(dirs.substr(at, end - at)) / b.torchrun; end > at && fs::exists(p)) {
          b.torchrun = p.string();
          break;
        }
        at = end + 1;
      }
    }
    loom::check(fs::exists(b.torchrun), "--torchrun {} does not exist (make deps installs it in .venv; make bench passes it)",
                b.torchrun);
    const fs::path self = fs::read_symlink("/proc/self/exe");
    const fs::path tmp = fs::temp_directory_path() / fmt::format("loom_bench_sharding_{}", ::getpid());
    fs::create_directories(tmp);
    std::vector<int> worlds;
    for (std::size_t pos = 0; pos < b.worlds.size();) {
      const auto comma = b.worlds.find(',', pos);
      worlds.push_back(std::stoi(b.worlds.substr(pos, comma - pos)));
      pos = comma == std::string::npos ? b.worlds.size() : comma + 1;
    }
    // Bytes per element of the gathers and the reductions, over float32's 4.
    const auto dtype_bytes = [](const std::string& name) {
      int bytes = 4;
      loom::visit_member<loom::ShardingDtypeCatalog>(name, [&]<class T>() { bytes = T::facts.bytes; });
      return bytes;
    };
    // FullShard reduces in its param dtype unless --sharding_reduce_dtype says otherwise
    // (FSDP2's rule); the others in float32 then.
    const double gather_scale = dtype_bytes(args.sharding_param_dtype) / 4.0,
                 full_shard_reduce_scale = dtype_bytes(loom::dist::reduce_dtype_name(args)) / 4.0,
                 reduce_scale = args.sharding_reduce_dtype ? full_shard_reduce_scale : 1.0;
    fmt::print("sharding benchmark: MLP 256-{}x{}-10, per-device batch {}, {} steps ({} warm-up), CPU + Gloo{}; "
               "FullShard gathers {} and reduces in {}, the others reduce in {}\n",
               b.hidden, b.layers, b.batch, b.steps, StepClock::kWarmup, args.bf16 ? ", --bf16" : "",
               args.sharding_param_dtype, loom::dist::reduce_dtype_name(args),
               args.sharding_reduce_dtype.value_or(std::string(loom::sharding_dtype::Float32::name)));
    fmt::print("{:<11} {:>2} {:>9} | {:>10} {:>10} {:>6} | {:>10} {:>10} {:>6} | {:>9} {:>9} | {:>9}\n", "policy", "N",
               "step ms", "state MB", "formula", "ratio", "sent MB", "formula", "ratio", "gather MB", "reduce MB",
               "peak RSS");
    // Passed on to the workers when given (unset: the Trainer's default).
    const std::string find_unused =
        args.ddp_find_unused_parameters
            ? fmt::format(" --ddp_find_unused_parameters {}", *args.ddp_find_unused_parameters ? "true" : "false")
            : "";
    const std::string precision =
        fmt::format("{}{}", args.bf16 ? " --bf16 true" : "",
                    args.sharding_reduce_dtype ? " --sharding_reduce_dtype " + *args.sharding_reduce_dtype : "");
    const auto wanted = [&](std::string_view name) {
      const std::string list = "," + b.policies + ",";
      return list.find("," + std::string(name) + ",") != std::string::npos;
    };
    for (int world : worlds) {
      std::apply([&](auto... tag) {
        (([&] {
           using Tag = decltype(tag);
           if (!wanted(Tag::name)) return;
           const auto result = tmp / fmt::format("{}_{}.json", Tag::name, world);
           const auto cmd = fmt::format(
               "{} --standalone --nproc_per_node={} --no-python {} --worker_policy {} --result {} --steps {} "
               "--hidden {} --layers {} --batch {} --output_dir {}{}{}{}{} > {} 2>&1",
               b.torchrun, world, self.string(), Tag::name, result.string(), b.steps, b.hidden, b.layers, b.batch,
               (tmp / "out").string(), find_unused, b.probe_find_unused ? " --probe_find_unused true" : "", precision,
               Tag::facts.shards_parameters ? " --sharding_param_dtype " + args.sharding_param_dtype : "",
               (tmp / "log.txt").string());
           const int rc = std::system(cmd.c_str());
           if (rc != 0 || !fs::exists(result)) {
             std::ifstream log(tmp / "log.txt");
             std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
             loom::fail("{} at {} ranks failed (exit {}):\n{}", Tag::name, world, rc, text);
           }
           std::ifstream in(result);
           const auto j = nlohmann::json::parse(in);
           const double psi = j["psi"].get<double>(), n = world, mb = 1024.0 * 1024.0;
           const double state = j["params"].get<double>() + j["grads"].get<double>() + j["optimizer"].get<double>();
           const std::string name(Tag::name);
           const double formula = name == "ddp"     ? 16 * psi
                                  : name == "zero1" ? (8 + 8 / n) * psi
                                  : name == "zero2" ? (4 + 12 / n) * psi
                                                    : 16 * psi / n;
           const double sent = j["sent_per_step"].get<double>();
           // In units of Ψ (N-1)/N float32 bytes: DDP all-reduces twice; ZeRO-1/2 reduce-scatter
           // and all-gather float32 parameters; FullShard gathers twice (forward, backward).
           const double terms = name == "ddp"          ? 2 * reduce_scale
                                : name == "full_shard" ? 2 * gather_scale + full_shard_reduce_scale
                                                       : reduce_scale + 1;
           const double comm_formula = terms * 4 * psi * (n - 1) / n;
           fmt::print("{:<11} {:>2} {:>9.2f} | {:>10.2f} {:>10.2f} {:>6.3f} | {:>10.2f} {:>10.2f} {:>6} | {:>9.2f} {:>9.2f} | "
                      "{:>6.0f} MB",
                      name, world, j["step_ms"].get<double>(), state / mb, formula / mb, state / formula, sent / mb,
                      comm_formula / mb, comm_formula > 0 ? fmt::format("{:.3f}", sent / comm_formula) : "-",
                      j["gathered_per_step"].get<double>() / mb, j["reduced_per_step"].get<double>() / mb,
                      j["peak_rss"].get<double>() / mb);
           if (b.probe_find_unused) {
             const double walk = j["walk_us"].get<double>(), mask = j["mask_us"].get<double>();
             fmt::print(" | walk {:.1f} us, used-flag all-reduce {:.1f} us: {:.3f} % of the step", walk, mask,
                        (walk + mask) / 10.0 / j["step_ms"].get<double>());
           }
           fmt::print("\n");
           std::fflush(stdout);
         }()),
         ...);
      }, PolicyList{});
    }
    fs::remove_all(tmp);
    return 0;
  });
}
