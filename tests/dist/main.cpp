// Multi-process tests of the sharding policies: real processes, a real TCPStore and real
// ProcessGroupGloo on the CPU. This one binary is both sides:
//
//   * with LOOM_DIST_WORKER set it is a worker: it trains a small MLP with the Trainer under
//     the sharding and precision its flags name (sharding::FromArgs, precision::FromArgs), and writes
//     its final weights, model-state bytes and log history for the test to read;
//   * otherwise it is the doctest runner: each test starts 1, 2 or 4 workers with the
//     variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
//     waits for them with a deadline, and compares what they wrote.
//
// Registered in CTest as dist.* (label dist); tests/dist/README.md says what each shows.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <loom/loom.hpp>

#include "../accelerator_loop.hpp"
#include "../gan_loop.hpp"
#include "../trainer_support.hpp"
#include "../trainer/token_support.hpp"
#include "support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

// ============================================================================ the worker ===

namespace worker {

/// The worker's own flags (beside every TrainingArguments flag).
struct WorkerArguments {
  std::string result = "";   ///< prefix of the files the worker writes
  int64_t rows = 256;        ///< examples in the synthetic dataset
  int64_t hidden = 256;      ///< width of the MLP
  int64_t die_rank = -1;     ///< this rank kills itself (SIGKILL) ...
  int64_t die_step = -1;     ///< ... at the end of this optimizer step
  bool hang = false;         ///< stop (SIGSTOP) instead of dying: a rank that no longer answers
  std::string die_signal = "KILL";  ///< KILL, or TERM/USR1/INT: a preemption signal the Trainer handles
  std::string task = "mlp";  ///< mlp (the MLP above), tokens (ragged token batches, tests/trainer/token_support.hpp), batch_metrics (--batch_eval_metrics on them), buffers, lora, stream (the MLP on a stream, RowStream)
  bool nested = false;       ///< the MLP also holds `pair`, a FullShardUnit with a FullShardUnit inside (auto-wrap tests)
  bool partly_used = false;  ///< the MLP also holds a layer the loss never reaches (spare) and one it reaches for rare rows only (rare)
  bool backward_twice = false;  ///< training_step backpropagates two losses one after the other
  std::string loop = "trainer";  ///< trainer, or accelerator: the same run as a loop written on loom::Accelerator; gan: tests/gan_loop.hpp's GAN (two optimizers)
  int64_t poison_step = -1;  ///< every rank's loss is infinite in this optimizer step (an fp16 overflow everywhere)
  bool evaluate_first = false;  ///< evaluate() before train(): outside training, where --bf16_full_eval casts the model
};

// --backward_twice and --poison_step, for DistTrainer (set by run()).
inline bool g_backward_twice = false;
inline int64_t g_poison_step = -1;

using loom_test::Batch;  // x: float [N, 16]; labels: int64 [N]

// Two FullShard units and a head outside every unit (the root unit under FullShard).
// partly_used adds, before the head, `spare` (never in the loss) and `rare`, whose output is
// added for the rows whose first feature exceeds 1.5 and which is left out of the graph when
// a batch holds none: used on some ranks and steps, on none in others.
// A block with a FullShardUnit inside (nested units): inner, then its own layer `mix`.
// g_pair_runs counts its forwards in training (a recomputed block runs once more in backward).
inline int64_t g_pair_runs = 0;
struct PairImpl : torch::nn::Module {
  explicit PairImpl(int64_t hidden)
      : inner(register_module("inner", loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(hidden, hidden)))),
        mix(register_module("mix", torch::nn::Linear(hidden, hidden))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training()) ++g_pair_runs;
    return torch::tanh(mix->forward(torch::tanh(inner->forward(x))));
  }
  loom::FullShardUnit<torch::nn::Linear> inner;
  torch::nn::Linear mix;
};
TORCH_MODULE(Pair);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden, bool partly_used = false, bool nested = false)
      : l1(register_module("l1", loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(16, hidden)))),
        l2(register_module("l2", loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(hidden, hidden)))) {
    if (nested) pair = register_module("pair", loom::FullShardUnit<Pair>(Pair(hidden)));
    if (partly_used) {
      spare = register_module("spare", torch::nn::Linear(hidden, hidden));
      rare = register_module("rare", torch::nn::Linear(hidden, 4));
    }
    head = register_module("head", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(l2->forward(torch::tanh(l1->forward(x))));
    if (!pair.is_empty()) h = pair->forward(h);
    auto out = head->forward(h);
    if (rare.is_empty()) return out;
    const auto mask = x.select(1, 0).gt(1.5).unsqueeze(1).to(out.scalar_type());
    const bool any = mask.any().item<bool>();
    if (is_training()) rare_used.push_back(any ? 1 : 0);
    return any ? out + mask * rare->forward(h) : out;
  }
  loom::FullShardUnit<torch::nn::Linear> l1, l2;
  loom::FullShardUnit<Pair> pair{nullptr};
  torch::nn::Linear spare{nullptr}, rare{nullptr}, head{nullptr};
  std::vector<int> rare_used;  // per training forward: did the batch reach `rare`
};
TORCH_MODULE(Mlp);

// The blocks whose activations are recomputed in backward (--gradient_checkpointing), by name.
inline std::vector<std::string> recomputing(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& m : model.named_modules("", /*include_self=*/false))
    if (const auto* r = dynamic_cast<const loom::dist::Recomputable*>(m.value().get()); r != nullptr && r->loom_recompute)
      names.push_back(m.key());
  return names;
}

// Kills this process at the end of a chosen step (the fault tests), or sends it a
// preemption signal (a real one, to this thread).
struct Killer {
  int64_t rank = std::getenv("RANK") ? std::atoll(std::getenv("RANK")) : 0;
  int64_t die_rank = -1, die_step = -1;
  bool hang = false;
  int signal = SIGKILL;
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& state, loom::TrainerControl&) {
    if (rank != die_rank || state.global_step != die_step) return;
    if (signal == SIGKILL) ::kill(::getpid(), hang ? SIGSTOP : SIGKILL);
    else ::raise(signal);
  }
};

template <class Sharding, class Precision>
struct DistTrainer : loom::Trainer<DistTrainer<Sharding, Precision>, Mlp, Sharding, Precision, loom::Callbacks<Killer>> {
  using Base = loom::Trainer<DistTrainer<Sharding, Precision>, Mlp, Sharding, Precision, loom::Callbacks<Killer>>;
  using Base::Base;
  loom::ModelOutput compute_loss(Mlp& model, Batch& batch) {
    auto out = loom_test::cross_entropy(model, batch);
    if (model->is_training() && this->state().global_step == g_poison_step)
      out.loss = out.loss * std::numeric_limits<float>::infinity();
    return out;
  }
  torch::Tensor training_step(Mlp& model, Batch& batch, double divisor) {
    if (!g_backward_twice) return Base::training_step(model, batch, divisor);
    torch::Tensor total;
    for (int i = 0; i < 2; ++i) {
      const auto loss = loom_test::cross_entropy(model, batch).loss / (2 * divisor);
      this->backward(loss);
      total = i == 0 ? loss.detach() : total + loss.detach();
    }
    return total;
  }
  // Needs every rank's predictions in order: exercises the all-gather of evaluation results.
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    const auto correct = p.predictions.argmax(1).eq(p.label_ids).to(torch::kDouble);
    // weighted by position, so a reordered gather changes the value
    const auto weights = torch::arange(1, correct.size(0) + 1, torch::kDouble);
    return {{"accuracy", correct.mean().item<double>()},
            {"ordered_accuracy", (correct * weights).sum().item<double>() / weights.sum().item<double>()},
            {"rows", static_cast<double>(p.predictions.size(0))}};
  }
};

// A fixed classification problem, drawn from its own generator (independent of the seed).
inline loom::data::TensorDataset<Batch> make_data(int64_t rows, uint64_t seed = 1234) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({rows, 16}, gen);
  auto w = torch::randn({16, 4}, gen);
  auto labels = (x.matmul(w) + 0.5 * torch::randn({rows, 4}, gen)).argmax(1);
  return loom::data::TensorDataset<Batch>({x, labels});
}

// The stream task's data: make_data's rows as a stream (data/iterable.hpp) in an order
// shuffled per epoch (a permutation seeded 17 + epoch), with skip(): each example it makes is
// recorded in g_stream_reads as [epoch, index], so the test sees what each rank read.
inline std::vector<std::array<int64_t, 2>> g_stream_reads;
struct RowStream {
  std::shared_ptr<const Batch> rows;
  int64_t n = 0, epoch = 0, next_index = 0;
  torch::Tensor order;
  explicit RowStream(int64_t rows_) : rows(std::make_shared<const Batch>(make_data(rows_).tensors())), n(rows_) {
    set_epoch(0);
  }
  std::optional<Batch> next() {
    if (next_index >= n) return std::nullopt;
    g_stream_reads.push_back({epoch, next_index});
    const int64_t row = order[next_index++].item<int64_t>();
    return Batch{rows->x[row], rows->labels[row]};
  }
  int64_t skip(int64_t k) {
    k = std::min(k, n - next_index);
    next_index += k;
    return k;
  }
  void set_epoch(int64_t e) {
    epoch = e;
    next_index = 0;
    order = loom::data::seeded_permutation(n, 17, e);
  }
  nlohmann::json state_dict() const { return {{"epoch", epoch}, {"index", next_index}}; }
  void load_state_dict(const nlohmann::json& j) {
    set_epoch(j.at("epoch").get<int64_t>());
    next_index = j.at("index").get<int64_t>();
  }
};

// A linear model with a buffer each rank moves differently in a training forward (by RANK +
// 1), as BatchNorm's running statistics move with each rank's own batch: the buffers task
// shows whose values the next forward starts from.
struct CountingImpl : torch::nn::Module {
  CountingImpl() : lin(register_module("lin", torch::nn::Linear(16, 4))) {
    count = register_buffer("count", torch::zeros({1}, torch::kDouble));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training()) count.add_(rank + 1.0);
    return lin->forward(x);
  }
  torch::nn::Linear lin;
  torch::Tensor count;
  double rank = std::getenv("RANK") ? std::atof(std::getenv("RANK")) : 0.0;
};
TORCH_MODULE(Counting);

struct CountingTrainer : loom::Trainer<CountingTrainer, Counting, loom::sharding::DDP> {
  using Trainer::Trainer;
  loom::ModelOutput compute_loss(Counting& model, Batch& batch) { return loom_test::cross_entropy(model, batch); }
};

// The lora task: two FullShard units whose blocks each hold an adaptable projection, and a
// head. LoRA goes on the projections and the head is trained whole (modules_to_save); the
// rest of the model is frozen.
struct LoraBlockImpl : torch::nn::Module {
  LoraBlockImpl(int64_t in, int64_t out) : proj(register_module("proj", loom::peft::AdaptableLinear(in, out, true))) {
    torch::NoGradGuard no_grad;
    proj->weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(in)));
    proj->bias.normal_(0.0, 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(proj(x)); }
  loom::peft::AdaptableLinear proj;
};
TORCH_MODULE(LoraBlock);

struct LoraMlpImpl : torch::nn::Module {
  explicit LoraMlpImpl(int64_t hidden)
      : b1(register_module("b1", loom::FullShardUnit<LoraBlock>(LoraBlock(16, hidden)))),
        b2(register_module("b2", loom::FullShardUnit<LoraBlock>(LoraBlock(hidden, hidden)))),
        head(register_module("head", torch::nn::Linear(hidden, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(b2->forward(b1->forward(x))); }
  loom::FullShardUnit<LoraBlock> b1, b2;
  torch::nn::Linear head;
};
TORCH_MODULE(LoraMlp);

template <class Sharding, class Precision>
struct LoraTrainer : loom::Trainer<LoraTrainer<Sharding, Precision>, LoraMlp, Sharding, Precision> {
  using loom::Trainer<LoraTrainer<Sharding, Precision>, LoraMlp, Sharding, Precision>::Trainer;
  loom::ModelOutput compute_loss(LoraMlp& model, Batch& batch) { return loom_test::cross_entropy(model, batch); }
};

// The tagger's Trainer, recording the tokens of each training batch it reads (num_items is
// called on every batch, on the host).
template <class Sharding>
struct TokenRecorder : loom::Trainer<TokenRecorder<Sharding>, loom_test::TokenTagger, Sharding> {
  using loom::Trainer<TokenRecorder<Sharding>, loom_test::TokenTagger, Sharding>::Trainer;
  std::vector<int64_t> batch_tokens;
  int64_t num_items(const loom_test::TokenBatch& b) {
    batch_tokens.push_back(b.attention_mask.sum().template item<int64_t>());
    return b.input_ids.size(0);
  }
};

// The tokens task: predictions on ragged token batches before training (rank 0 writes them),
// then training with the input tokens counted; every rank writes its count and the tokens of
// each batch it trained on.
template <class Sharding>
void run_tokens(const loom::TrainingArguments& args, const WorkerArguments& w) {
  const loom_test::RaggedTokens train(w.rows, 1234), eval(41, 99);  // 11 eval batches of 4: 6 on rank 0, 5 on rank 1
  TokenRecorder<Sharding> trainer(args, loom_test::fresh_tagger(), train);
  const auto r = trainer.predict(eval);
  const auto& world = trainer.world();
  if (world.rank == 0)
    loom::checkpoint::save_safetensors({{"predictions", r.predictions}, {"label_ids", r.label_ids},
                                        {"inputs", r.inputs}, {"losses", r.losses}},
                                       w.result + ".predict.safetensors");
  trainer.train();
  std::ofstream(w.result + ".rank" + std::to_string(world.rank) + ".json")
      << nlohmann::json{{"tokens", trainer.state().num_input_tokens_seen}, {"world", world.size},
                        {"batch_tokens", trainer.batch_tokens}}.dump();
}

// The batch_metrics task: --batch_eval_metrics with argmax preprocessing on ragged token
// batches; every rank writes each compute_metrics call it saw and the metrics.
template <class Sharding>
struct BatchMetricsRecorder : loom::Trainer<BatchMetricsRecorder<Sharding>, loom_test::TokenTagger, Sharding> {
  using loom::Trainer<BatchMetricsRecorder<Sharding>, loom_test::TokenTagger, Sharding>::Trainer;
  nlohmann::json calls = nlohmann::json::array();
  double correct = 0, total = 0;
  torch::Tensor preprocess_logits_for_metrics(const torch::Tensor& logits, const torch::Tensor&) {
    return logits.argmax(-1);
  }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p, bool compute_result) {
    const auto mask = p.label_ids.ne(-100);
    correct += p.predictions.eq(p.label_ids).logical_and(mask).sum().template item<double>();
    total += mask.sum().template item<double>();
    calls.push_back({{"rows", p.predictions.size(0)}, {"compute_result", compute_result},
                     {"id_sum", p.predictions.masked_select(mask).sum().template item<int64_t>()}});
    if (!compute_result) return {};
    return {{"accuracy", correct / total}};
  }
};

template <class Sharding>
void run_batch_metrics(const loom::TrainingArguments& args, const WorkerArguments& w) {
  BatchMetricsRecorder<Sharding> trainer(args, loom_test::fresh_tagger(), loom::no_train_dataset,
                                         loom_test::RaggedTokens(41, 99));  // 11 batches of 4
  const auto m = trainer.evaluate();
  std::ofstream(w.result + ".rank" + std::to_string(trainer.world().rank) + ".json")
      << nlohmann::json{{"calls", trainer.calls}, {"accuracy", m.get("eval_accuracy").value_or(-1)},
                        {"loss", m.get("eval_loss").value_or(-1)}}.dump();
}

// The memory plan's lines (tests/dist/memory_plan.cpp compares them with the measured bytes).
inline nlohmann::json plan_json(const std::optional<loom::MemoryPlan>& plan) {
  if (!plan) return nullptr;
  return {{"params", plan->params}, {"frozen", plan->frozen}, {"grads", plan->grads}, {"optimizer", plan->optimizer},
          {"gathered", plan->gathered}, {"host", plan->host}};
}

inline int run(int argc, char** argv) {
  return loom::run_main([&] {
    loom::TrainingArguments defaults;
    defaults.use_cpu = true;
    defaults.disable_tqdm = true;
    auto [w, args] = loom::parse_args(argc, argv, WorkerArguments{}, defaults);
    loom::validate(args);
    g_backward_twice = w.backward_twice;
    g_poison_step = w.poison_step;
    if (w.task == "buffers") {
      CountingTrainer trainer(args, Counting(), make_data(w.rows));
      trainer.train();
      std::ofstream(w.result + ".rank" + std::to_string(trainer.world().rank) + ".json")
          << nlohmann::json{{"count", trainer.model()->count.item<double>()}}.dump();
      return 0;
    }
    if (w.task == "tokens") {
      if (args.sharding == "ddp") run_tokens<loom::sharding::DDP>(args, w);
      else run_tokens<loom::sharding::NoShard>(args, w);
      return 0;
    }
    if (w.task == "batch_metrics") {
      if (args.sharding == "ddp") run_batch_metrics<loom::sharding::DDP>(args, w);
      else run_batch_metrics<loom::sharding::NoShard>(args, w);
      return 0;
    }
    auto data = make_data(w.rows);
    auto eval_data = make_data(100, 99);  // 13 batches of 8 (the last of 4): uneven across ranks
    // One Trainer type for every policy: the sharding and precision the flags name, chosen as
    // the run starts (loom::sharding::FromArgs, loom::precision::FromArgs).
    using Sharding = loom::sharding::FromArgs;
    using Precision = loom::precision::FromArgs;
    [&] {
      loom::set_seed(args.seed);
      if (w.task == "lora") {
        LoraMlp model(w.hidden);
        loom::peft::LoraConfig lora;
        lora.r = 4, lora.lora_alpha = 8, lora.target_modules = {"proj"}, lora.modules_to_save = {"head"};
        loom::peft::apply_lora(*model, lora);
        std::map<std::string, torch::Tensor> frozen;
        for (const auto& p : model->named_parameters())
          if (!p.value().requires_grad()) frozen[p.key()] = p.value().detach().clone();
        LoraTrainer<Sharding, Precision> trainer(args, model, data, eval_data);
        trainer.train();
        double base_change = 0;  // (FullShard shards the frozen base too: read it gathered)
        trainer.accelerator().summon_full_params([&] {
          for (const auto& p : trainer.model()->named_parameters())
            if (frozen.contains(p.key())) base_change += (p.value() - frozen.at(p.key())).abs().sum().template item<double>();
        });
        const auto bytes = trainer.model_state_bytes();
        std::ofstream(w.result + ".rank" + std::to_string(trainer.world().rank) + ".json")
            << nlohmann::json{{"base_change", base_change}, {"frozen", frozen.size()}, {"optimizer", bytes.optimizer},
                              {"grads", bytes.grads}, {"params", bytes.params}, {"world", trainer.world().size},
                              {"plan", plan_json(trainer.accelerator().memory_plan())}}.dump();
        trainer.save_model(w.result + ".model");
        return;
      }
      if (w.loop == "gan") {  // tests/gan_loop.hpp: a hand-written loop with two optimizers
        auto gan_args = args;
        loom_test::set_gan_args(gan_args);  // its own batch, steps and schedules; the flags' folders and policy
        loom::Accelerator<Sharding, Precision> acc(gan_args);
        auto model = loom_test::fresh_gan();
        const auto run = loom_test::gan_train(acc, model);
        std::ofstream(w.result + ".rank" + std::to_string(acc.process_index()) + ".json")
            << nlohmann::json{{"d_losses", run.d_losses}, {"g_losses", run.g_losses}, {"d_lrs", run.d_lrs},
                              {"g_lrs", run.g_lrs}}.dump();
        acc.save_model(w.result + ".model");
        return;
      }
      if (w.loop == "accelerator") {  // tests/accelerator_loop.hpp: what the Trainer does, by hand
        Mlp model(w.hidden, w.partly_used);
        loom::Accelerator<Sharding, Precision> acc(args);
        loom_test::plain_train(
            acc, model, loom::data::AnyDataset<Batch>(data),
            [](Mlp& m, const Batch& b) { return torch::cross_entropy_loss(m->forward(b.x), b.labels); },
            std::optional<loom::data::AnyDataset<Batch>>(eval_data));
        if (acc.is_main_process()) acc.state().save(fs::path(args.output_dir) / "trainer_state.json");
        std::ofstream(w.result + ".rank" + std::to_string(acc.process_index()) + ".json")
            << nlohmann::json{{"world", acc.num_processes()}}.dump();
        acc.save_model(w.result + ".model");
        return;
      }
      if (w.task == "stream") {
        DistTrainer<Sharding, Precision> trainer(args, Mlp(w.hidden), RowStream(w.rows), eval_data);
        trainer.train();
        std::ofstream(w.result + ".rank" + std::to_string(trainer.world().rank) + ".json")
            << nlohmann::json{{"reads", g_stream_reads}}.dump();
        trainer.save_model(w.result + ".model");
        return;
      }
      DistTrainer<Sharding, Precision> trainer(args, Mlp(w.hidden, w.partly_used, w.nested), data, eval_data);
      trainer.template callback<Killer>().die_rank = w.die_rank;
      trainer.template callback<Killer>().die_step = w.die_step;
      trainer.template callback<Killer>().hang = w.hang;
      trainer.template callback<Killer>().signal = w.die_signal == "TERM"   ? SIGTERM
                                                   : w.die_signal == "USR1" ? SIGUSR1
                                                   : w.die_signal == "INT"  ? SIGINT
                                                                            : SIGKILL;
      if (w.evaluate_first) {
        const auto first = trainer.evaluate();
        std::ofstream(w.result + ".first_eval.rank" + std::to_string(trainer.world().rank) + ".json")
            << nlohmann::json{{"eval_loss", first.get("eval_loss").value()}}.dump();
      }
      trainer.train();
      const auto& world = trainer.world();
      // Every rank: what it holds. Rank 0: the gathered weights.
      const auto bytes = trainer.model_state_bytes();
      int64_t psi = 0;
      for (const auto& p : trainer.model()->parameters()) psi += p.numel();
      const auto launches = trainer.sharding().grad_launches();
      std::ofstream(w.result + ".rank" + std::to_string(world.rank) + ".json")
          << nlohmann::json{{"params", bytes.params}, {"grads", bytes.grads}, {"optimizer", bytes.optimizer},
                            {"host", bytes.host}, {"psi", psi}, {"world", world.size}, {"launched_during_backward", launches.during_backward},
                            {"launched_after_backward", launches.after_backward},
                            {"rare_used", trainer.model()->rare_used}, {"units", trainer.sharding().unit_names()},
                            {"recomputing", recomputing(*trainer.model())}, {"pair_runs", g_pair_runs},
                            {"plan", plan_json(trainer.accelerator().memory_plan())}}.dump();
      // save_model gathers the parameters under every policy; rank 0 writes.
      trainer.save_model(w.result + ".model");
    }();
    return 0;
  });
}

}  // namespace worker

// ============================================================================ the tests ===

using namespace dist_test;  // NOLINT: the runner helpers, in every test below

TEST_CASE("2 and 4 ranks with batch b reproduce one process with batch 2b / 4b, for every policy") {
  constexpr int64_t b = 4;
  for (int world : {2, 4}) {
    const auto ref = dist_dir("equiv_ref_" + std::to_string(world));
    require_success(launch(1, base_args("no", b * world, ref), ref / "logs", /*launched=*/false));
    const auto want = logged_losses(ref);
    REQUIRE(want.size() == 10);
    for (const auto& policy : kPolicies) {
      CAPTURE(policy);
      CAPTURE(world);
      const auto out = dist_dir("equiv_" + policy + "_" + std::to_string(world));
      require_success(launch(world, base_args(policy, b, out), out / "logs"));
      check_losses(logged_losses(out), want, 1e-5);
      // Evaluation: each rank evaluates its batches; losses and ordered predictions gathered.
      for (const char* key : {"eval_loss", "eval_accuracy", "eval_ordered_accuracy"}) {
        CAPTURE(key);
        check_losses(logged(out, key), logged(ref, key), 1e-5);
      }
      CHECK(logged(out, "eval_rows") == std::vector<double>{100, 100});
      const double diff = weight_difference(out, ref);
      MESSAGE(policy << " at " << world << " ranks: final weights differ by " << diff << " (relative)");
      CHECK(diff < 1e-5);
    }
  }
}

TEST_CASE("fp16 and bf16 train under every sharding policy close to one process") {
  for (const std::string precision : {"--fp16", "--bf16"}) {
    const auto ref = dist_dir("prec_ref" + precision);
    auto ref_args = base_args("no", 8, ref);
    ref_args.push_back(precision);
    require_success(launch(1, ref_args, ref / "logs", false));
    for (const auto& policy : kPolicies) {
      CAPTURE(policy);
      CAPTURE(precision);
      const auto out = dist_dir("prec_" + policy + precision);
      auto args = base_args(policy, 4, out);
      args.push_back(precision);
      require_success(launch(2, args, out / "logs"));
      // Low-precision forward passes of different batch splits round differently.
      check_losses(logged_losses(out), logged_losses(ref), 2e-2);
      CHECK(weight_difference(out, ref) < 2e-2);
    }
  }
}

TEST_CASE("fp16: an overflow on every rank skips the step under ZeRO-2 and FullShard, as in one process") {
  // The overflow flag is summed over ranks; the fused optimizer skips only on exactly 1, so
  // with both ranks overflowing it must be clamped, or the step applies inf gradients.
  const auto ref = dist_dir("poison_ref");
  auto ref_args = base_args("no", 8, ref, 6);
  set_flags(ref_args, {{"--fp16", "true"}, {"--poison_step", "2"}, {"--eval_strategy", "no"}});
  require_success(launch(1, ref_args, ref / "logs", false));
  const auto total = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  REQUIRE(total(logged(ref, "skipped_steps")) == 1.0);
  for (const std::string policy : {"zero2", "full_shard"}) {
    CAPTURE(policy);
    const auto out = dist_dir("poison_" + policy);
    auto args = base_args(policy, 4, out, 6);
    set_flags(args, {{"--fp16", "true"}, {"--poison_step", "2"}, {"--eval_strategy", "no"}});
    require_success(launch(2, args, out / "logs"));
    CHECK(total(logged(out, "skipped_steps")) == 1.0);
    for (const auto& [name, t] : weights(out)) {
      CAPTURE(name);
      CHECK(torch::isfinite(t).all().item<bool>());
    }
    // Skipped there as in one process: the runs go on together.
    const auto losses = logged_losses(out);
    for (double l : losses) CHECK(std::isfinite(l));
    const double diff = weight_difference(out, ref);
    MESSAGE(policy << ": final weights differ from one process by " << diff << " (relative)");
    CHECK(diff < 2e-2);
  }
}

TEST_CASE("per-rank model-state bytes follow the ZeRO formulas at 1, 2 and 4 ranks") {
  // fp32 master weights with AdamW: parameters 4 bytes, gradients 4, optimizer state 8
  // (exp_avg, exp_avg_sq) per parameter. The ZeRO paper's stages, for N ranks:
  //   DDP 4+4+8, ZeRO-1 4+4+8/N, ZeRO-2 4+(4+8)/N, FullShard (4+4+8)/N   (times psi)
  struct Formula {
    double p, g, o;  // divided by N when true
    bool pn, gn, on;
  };
  const std::map<std::string, Formula> formulas{{"ddp", {4, 4, 8, false, false, false}},
                                                {"zero1", {4, 4, 8, false, false, true}},
                                                {"zero2", {4, 4, 8, false, true, true}},
                                                {"full_shard", {4, 4, 8, true, true, true}}};
  for (int world : {1, 2, 4}) {
    for (const auto& policy : kPolicies) {
      CAPTURE(policy);
      CAPTURE(world);
      const auto out = dist_dir("mem_" + policy + "_" + std::to_string(world));
      auto args = base_args(policy, 4, out, 2);
      require_success(launch(world, args, out / "logs"));
      const auto& f = formulas.at(policy);
      for (int r = 0; r < world; ++r) {
        std::ifstream in((out / ("result.rank" + std::to_string(r) + ".json")).string());
        const auto j = nlohmann::json::parse(in);
        const double psi = j.at("psi").get<double>(), n = world;
        const double want_p = f.p * psi / (f.pn ? n : 1), want_g = f.g * psi / (f.gn ? n : 1),
                     want_o = f.o * psi / (f.on ? n : 1);
        const double got_p = j.at("params").get<double>(), got_g = j.at("grads").get<double>(),
                     got_o = j.at("optimizer").get<double>();
        MESSAGE(policy << " N=" << world << " rank " << r << ": params " << got_p << " (formula " << want_p
                       << "), grads " << got_g << " (" << want_g << "), optimizer " << got_o << " (" << want_o << ")");
        CHECK(std::abs(got_p - want_p) <= 0.05 * want_p);
        CHECK(std::abs(got_g - want_g) <= 0.05 * want_g);
        CHECK(std::abs(got_o - want_o) <= 0.05 * want_o);
        CHECK(std::abs((got_p + got_g + got_o) - (want_p + want_g + want_o)) <= 0.05 * (want_p + want_g + want_o));
      }
    }
  }
}

TEST_CASE("a ZeRO-2 checkpoint from 4 ranks resumes under DDP at 2, FullShard at 2 and no sharding at 1") {
  const auto full = dist_dir("reshard_zero2_4");
  auto args = base_args("zero2", 4, full);
  set_flag(args, "--save_strategy", "steps");
  set_flag(args, "--save_steps", "5");
  require_success(launch(4, args, full / "logs"));
  const auto ckpt = full / "checkpoint-5";
  REQUIRE(fs::exists(ckpt / "model.safetensors"));
  for (int r = 0; r < 4; ++r) REQUIRE(fs::exists(ckpt / ("optimizer-" + std::to_string(r) + "-of-4.safetensors")));
  const auto want = logged_losses(full);

  struct Resume {
    std::string policy;
    int world;
    int64_t batch;
  };
  for (const auto& [policy, world, batch] : {Resume{"ddp", 2, 8}, Resume{"full_shard", 2, 8}, Resume{"no", 1, 16}}) {
    CAPTURE(policy);
    const auto out = dist_dir("reshard_" + policy + "_" + std::to_string(world));
    auto resume = base_args(policy, batch, out);
    resume.insert(resume.end(), {"--resume_from_checkpoint", ckpt.string()});
    require_success(launch(world, resume, out / "logs", policy != "no"));
    // The resumed run's history holds the checkpoint's first 5 entries and its own 5.
    check_losses(logged_losses(out), want, 1e-5);
    const double diff = weight_difference(out, full);
    MESSAGE("resumed under " << policy << " at " << world << ": final weights differ by " << diff);
    CHECK(diff < 1e-5);
  }
}

TEST_CASE("LoRA at 2 ranks trains the adapter as one process does under every policy; the base is never written") {
  const auto ref = dist_dir("lora_ref");
  auto ref_args = base_args("no", 8, ref);
  set_flags(ref_args, {{"--task", "lora"}, {"--save_strategy", "steps"}, {"--save_steps", "5"}});
  require_success(launch(1, ref_args, ref / "logs", false));
  const auto want = logged_losses(ref);
  REQUIRE(want.size() == 10);
  const auto ref_state = nlohmann::json::parse(loom_test::read_bytes(ref / "result.rank0.json"));
  CHECK(ref_state["frozen"] == 4);  // the projections' weights and biases
  CHECK(ref_state["base_change"] == 0.0);
  for (const auto& policy : kPolicies) {
    CAPTURE(policy);
    const auto out = dist_dir("lora_" + policy);
    auto args = base_args(policy, 4, out);
    set_flags(args, {{"--task", "lora"}, {"--save_strategy", "steps"}, {"--save_steps", "5"}});
    require_success(launch(2, args, out / "logs"));
    check_losses(logged_losses(out), want, 1e-5);
    const double diff = weight_difference(out, ref);
    MESSAGE("LoRA under " << policy << " at 2 ranks: final adapter differs by " << diff << " (relative)");
    CHECK(diff < 1e-5);
    CHECK(weights(out).size() == 6);  // lora_A and lora_B of two projections, the head's weight and bias
    for (int r = 0; r < 2; ++r) {
      const auto state = nlohmann::json::parse(loom_test::read_bytes(out / ("result.rank" + std::to_string(r) + ".json")));
      CHECK(state["base_change"] == 0.0);  // the frozen base, bitwise on every rank
    }
    // The checkpoint: the adapter, and optimizer state (whole or in shards) for its tensors only.
    const auto ckpt = out / "checkpoint-5";
    CHECK(fs::exists(ckpt / "adapter_model.safetensors"));
    CHECK_FALSE(fs::exists(ckpt / "model.safetensors"));
    for (const auto& e : fs::directory_iterator(ckpt)) {
      const auto name = e.path().filename().string();
      if (!name.starts_with("optimizer") || e.path().extension() != ".safetensors") continue;
      for (const auto& [key, t] : loom::checkpoint::load_safetensors(e.path())) {
        CAPTURE(key);
        CHECK((key.find(".lora_") != std::string::npos || key.find("head.") != std::string::npos));
      }
    }
  }
  // FullShard's checkpoint resumes under DDP to the uninterrupted run's adapter.
  const auto out = dist_dir("lora_resume_ddp");
  auto resume = base_args("ddp", 4, out);
  const auto shard_ckpt = loom_test::tmp_root() / "dist" / "lora_full_shard" / "checkpoint-5";  // the loop's run
  set_flags(resume, {{"--task", "lora"}, {"--resume_from_checkpoint", shard_ckpt.string()}});
  require_success(launch(2, resume, out / "logs"));
  check_losses(logged_losses(out), want, 1e-5);
  const double diff = weight_difference(out, ref);
  MESSAGE("LoRA resumed under DDP from a FullShard checkpoint: final adapter differs by " << diff);
  CHECK(diff < 1e-5);
}

TEST_CASE("a rank that dies makes the others fail with a loom: line naming it; the last checkpoint survives") {
  struct Fault {
    int world;
    int die_rank;
    std::string expect;
  };
  for (const auto& [world, die_rank, expect] :
       {Fault{3, 1, "lost rank 1"}, Fault{2, 0, "lost rank 0 (it hosts the rendezvous store)"}}) {
    CAPTURE(world);
    CAPTURE(die_rank);
    const auto out = dist_dir("fault_" + std::to_string(world) + "_" + std::to_string(die_rank));
    auto args = base_args("ddp", 4, out, 20);
    set_flags(args, {{"--save_strategy", "steps"}, {"--save_steps", "5"}, {"--die_rank", std::to_string(die_rank)},
                     {"--die_step", "7"}, {"--ddp_timeout", "20"}});
    const auto l = launch(world, args, out / "logs", true, 90);
    CHECK(l.status[static_cast<std::size_t>(die_rank)] == 128 + SIGKILL);
    for (int r = 0; r < world; ++r) {
      if (r == die_rank) continue;
      INFO("rank " << r << " stderr:\n" << l.err[static_cast<std::size_t>(r)]);
      CHECK(l.status[static_cast<std::size_t>(r)] != 0);
      CHECK(l.status[static_cast<std::size_t>(r)] != -1);  // ended by itself, not by our deadline
      CHECK(l.err[static_cast<std::size_t>(r)].find("loom: ") != std::string::npos);
      CHECK(l.err[static_cast<std::size_t>(r)].find(expect) != std::string::npos);
    }
    MESSAGE("world " << world << ", rank " << die_rank << " killed: the others ended after " << l.seconds << " s");
    CHECK(l.seconds < 20);
    // checkpoint-5 was committed before the fault and is complete; nothing later exists.
    CHECK_NOTHROW(loom::checkpoint::validate_checkpoint(out / "checkpoint-5"));
    CHECK(fs::exists(out / "checkpoint-5" / "optimizer.safetensors"));
    CHECK_FALSE(fs::exists(out / "checkpoint-10"));
    CHECK(loom::checkpoint::latest_checkpoint(out) == out / "checkpoint-5");
  }
}

TEST_CASE("a preemption signal on one rank stops every rank after the same step, saved; the resume is bitwise") {
  for (const std::string policy : {"ddp", "zero2"}) {
    CAPTURE(policy);
    const auto straight = dist_dir("preempt_straight_" + policy);
    require_success(launch(2, base_args(policy, 8, straight, 12), straight / "logs"));

    const auto out = dist_dir("preempt_" + policy);
    auto args = base_args(policy, 8, out, 12);
    set_flags(args, {{"--die_rank", "1"}, {"--die_step", "4"}, {"--die_signal", "TERM"}});
    const auto l = launch(2, args, out / "logs");
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << " stderr:\n" << l.err[static_cast<std::size_t>(r)]);
      CHECK(l.status[static_cast<std::size_t>(r)] == loom::kExitPreempted);
    }
    // Rank 1's flag reaches every rank two steps later: both stop after step 6 and save it
    // (--save_strategy no: the preemption save is the only one).
    CHECK(l.err[0].find("loom: stopped by SIGTERM after step 6; the run is saved in " +
                        (out / "checkpoint-6").string()) != std::string::npos);
    CHECK(l.err[1].find("stopped by") == std::string::npos);  // rank 0 says it
    CHECK_NOTHROW(loom::checkpoint::validate_checkpoint(out / "checkpoint-6"));
    CHECK(loom::checkpoint::latest_checkpoint(out) == out / "checkpoint-6");

    auto resume = base_args(policy, 8, out, 12);
    set_flag(resume, "--resume_from_checkpoint", "latest");
    require_success(launch(2, resume, out / "logs2"));
    CHECK(weight_difference(out, straight) == 0.0);
    check_losses(logged_losses(out), logged_losses(straight), 0.0);
  }
}

namespace {
// Runs `f` with LOOM_FAULT_POINT set for the processes it launches.
template <class F>
auto with_fault(const std::string& spec, F&& f) {
  ::setenv("LOOM_FAULT_POINT", spec.c_str(), 1);
  auto result = f();
  ::unsetenv("LOOM_FAULT_POINT");
  return result;
}

// Dotted leftovers (.tmp-, .old-, .deleting-) in a run's output folder.
std::vector<std::string> leftovers(const fs::path& out) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind(".", 0) == 0) found.push_back(e.path().filename().string());
  return found;
}
}  // namespace

TEST_CASE("a save killed at each crash point resumes from a complete checkpoint, cleaned, bitwise") {
  // One process: checkpoints at 3, 6, 9 keeping one; the save at step 6 is killed.
  auto run_args = [](const fs::path& out) {
    auto a = base_args("no", 16, out, 9);
    set_flags(a, {{"--save_strategy", "steps"}, {"--save_steps", "3"}, {"--save_total_limit", "1"}});
    return a;
  };
  const auto straight = dist_dir("crash_straight");
  require_success(launch(1, run_args(straight), straight / "logs", false));
  const std::vector<std::string> after_rename{"renamed", "committed", "rotating"};
  for (const auto point : loom::checkpoint::kFaultPoints) {
    if (point == "old_moved") continue;  // only when a step is saved twice: below
    CAPTURE(point);
    const auto out = dist_dir("crash_" + std::string(point));
    // The second save (step 6): model, optimizer and RNG files make 3 safetensors writes per
    // save; the first rotation is the one at step 6.
    const std::string n = point == "tensor_file_tmp" ? "4" : point == "rotating" ? "1" : "2";
    const auto l = with_fault(std::string(point) + ":" + n, [&] { return launch(1, run_args(out), out / "logs", false); });
    REQUIRE(l.status[0] == 128 + SIGKILL);
    const bool done = std::find(after_rename.begin(), after_rename.end(), point) != after_rename.end();
    CHECK(loom::checkpoint::latest_checkpoint(out) == out / (done ? "checkpoint-6" : "checkpoint-3"));
    auto resume = run_args(out);
    set_flag(resume, "--resume_from_checkpoint", "latest");
    require_success(launch(1, resume, out / "logs2", false));
    CHECK(leftovers(out).empty());
    CHECK(weight_difference(out, straight) == 0.0);
  }

  // A step saved twice (a resume from an older checkpoint into the same folder): killed
  // between moving the old checkpoint-6 aside and renaming the new one into place.
  {
    const auto out = dist_dir("crash_old_moved");
    require_success(launch(1, run_args(out), out / "logs", false));  // checkpoint-9 only (limit 1)
    auto again = run_args(out);
    set_flag(again, "--save_total_limit", "3");
    set_flag(again, "--resume_from_checkpoint", (out / "checkpoint-9").string());
    set_flag(again, "--max_steps", "12");
    require_success(launch(1, again, out / "logs1", false));  // checkpoint-9 and -12
    set_flag(again, "--resume_from_checkpoint", (out / "checkpoint-9").string());
    const auto l = with_fault("old_moved", [&] { return launch(1, again, out / "logs2", false); });
    REQUIRE(l.status[0] == 128 + SIGKILL);
    CHECK_FALSE(fs::exists(out / "checkpoint-12"));  // moved aside, the new one not yet in place
    set_flag(again, "--resume_from_checkpoint", "latest");
    require_success(launch(1, again, out / "logs3", false));
    CHECK(leftovers(out).empty());
    CHECK_NOTHROW(loom::checkpoint::validate_checkpoint(out / "checkpoint-12"));
  }

  // Two ranks under ZeRO-2: rank 1 lost after writing its optimizer shard, or rank 0 after the
  // rename; the other rank fails with a loom: line, and the resume is bitwise.
  auto zero2_args = [](const fs::path& out) {
    auto a = base_args("zero2", 8, out, 9);
    set_flags(a, {{"--save_strategy", "steps"}, {"--save_steps", "3"}, {"--ddp_timeout", "20"}});
    return a;
  };
  const auto straight2 = dist_dir("crash_straight_zero2");
  require_success(launch(2, zero2_args(straight2), straight2 / "logs"));
  struct Lost {
    std::string spec;
    int rank;
    std::string latest;
  };
  for (const auto& [spec, rank, latest] :
       {Lost{"optimizer_written:2@1", 1, "checkpoint-3"}, Lost{"renamed:2@0", 0, "checkpoint-6"}}) {
    CAPTURE(spec);
    const auto out = dist_dir("crash_zero2_" + std::to_string(rank));
    const auto l = with_fault(spec, [&] { return launch(2, zero2_args(out), out / "logs", true, 90); });
    CHECK(l.status[static_cast<std::size_t>(rank)] == 128 + SIGKILL);
    const auto other = static_cast<std::size_t>(1 - rank);
    INFO("surviving rank stderr:\n" << l.err[other]);
    CHECK(l.status[other] == 2);
    CHECK(l.err[other].find("loom: ") != std::string::npos);
    CHECK(loom::checkpoint::latest_checkpoint(out) == out / latest);
    auto resume = zero2_args(out);
    set_flag(resume, "--resume_from_checkpoint", "latest");
    require_success(launch(2, resume, out / "logs2"));
    CHECK(leftovers(out).empty());
    CHECK(weight_difference(out, straight2) == 0.0);
  }
}

TEST_CASE("ragged token-level predictions and token counts at 2 ranks equal one process") {
  // Eval batches padded to their own longest sequence: the gather pads dim 1 across ranks
  // with -100 and puts the batches back in order; the tokens are summed over the ranks.
  auto args = [](const std::string& sharding, int64_t batch, const fs::path& out) {
    return std::vector<std::string>{"--task", "tokens", "--sharding", sharding, "--rows", "64",
                                    "--per_device_train_batch_size", std::to_string(batch),
                                    "--per_device_eval_batch_size", "4", "--num_train_epochs", "1",
                                    "--include_num_input_tokens_seen", "non_padding", "--include_for_metrics",
                                    "inputs,loss", "--logging_steps", "2", "--save_strategy", "no",
                                    "--ddp_timeout", "30", "--output_dir", out.string(),
                                    "--result", (out / "result").string()};
  };
  const auto ref = dist_dir("tokens_ref");
  require_success(launch(1, args("no", 8, ref), ref / "logs", false));
  const auto out = dist_dir("tokens_ddp");
  require_success(launch(2, args("ddp", 4, out), out / "logs"));
  std::map<std::string, torch::Tensor> want, got;
  for (auto& [k, t] : loom::checkpoint::load_safetensors(ref / "result.predict.safetensors")) want[k] = t;
  for (auto& [k, t] : loom::checkpoint::load_safetensors(out / "result.predict.safetensors")) got[k] = t;
  REQUIRE(want.size() == 4);
  const loom_test::RaggedTokens eval(41, 99);
  int64_t widest = 0;
  for (auto len : eval.lengths()) widest = std::max(widest, len);
  CHECK(want.at("predictions").sizes() == std::vector<int64_t>{41, widest, 11});
  CHECK(want.at("predictions").eq(-100).any().item<bool>());  // some batches are narrower
  for (const auto& [k, t] : want) {
    CAPTURE(k);
    REQUIRE(got.contains(k));
    CHECK(torch::equal(got.at(k), t));
  }
  int64_t tokens = 0;
  for (auto len : loom_test::RaggedTokens(64, 1234).lengths()) tokens += len;
  for (const auto& [dir, world] : {std::pair{ref, 1}, std::pair{out, 2}})
    for (int r = 0; r < world; ++r) {
      std::ifstream in((dir / ("result.rank" + std::to_string(r) + ".json")).string());
      CHECK(nlohmann::json::parse(in).at("tokens").get<int64_t>() == tokens);
    }
}

TEST_CASE("batch_eval_metrics at 2 ranks: every rank sees one call per round of gathered batches") {
  // 11 batches of 4 (the last of 1) evaluated with argmax preprocessing: one process calls
  // compute_metrics 11 times; 2 ranks call it on both ranks once per round, with the round's
  // two batches gathered in batch order (HF gathers each step's batches across processes).
  auto args = [](const std::string& sharding, const fs::path& out) {
    return std::vector<std::string>{"--task", "batch_metrics", "--sharding", sharding, "--batch_eval_metrics", "true",
                                    "--per_device_eval_batch_size", "4", "--save_strategy", "no", "--ddp_timeout",
                                    "30", "--output_dir", out.string(), "--result", (out / "result").string()};
  };
  const auto read = [](const fs::path& dir, int rank) {
    std::ifstream in((dir / ("result.rank" + std::to_string(rank) + ".json")).string());
    return nlohmann::json::parse(in);
  };
  const auto ref = dist_dir("batch_metrics_ref");
  require_success(launch(1, args("no", ref), ref / "logs", false));
  const auto out = dist_dir("batch_metrics_ddp");
  require_success(launch(2, args("ddp", out), out / "logs"));
  const auto one = read(ref, 0);
  const auto& calls = one.at("calls");
  REQUIRE(calls.size() == 11);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].at("rows").get<int64_t>() == (i < 10 ? 4 : 1));
    CHECK(calls[i].at("compute_result").get<bool>() == (i == 10));
  }
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const auto two = read(out, rank);
    const auto& got = two.at("calls");
    REQUIRE(got.size() == 6);
    for (std::size_t j = 0; j < got.size(); ++j) {
      CAPTURE(j);
      const std::size_t a = 2 * j, b = std::min<std::size_t>(2 * j + 1, 10);
      CHECK(got[j].at("rows").get<int64_t>() == (j < 5 ? 8 : 1));
      CHECK(got[j].at("compute_result").get<bool>() == (j == 5));
      const int64_t want = calls[a].at("id_sum").get<int64_t>() + (b != a ? calls[b].at("id_sum").get<int64_t>() : 0);
      CHECK(got[j].at("id_sum").get<int64_t>() == want);
    }
    CHECK(two.at("accuracy").get<double>() == one.at("accuracy").get<double>());
    CHECK(two.at("loss").get<double>() == doctest::Approx(one.at("loss").get<double>()).epsilon(1e-6));
  }
}

TEST_CASE("group_by_length at 2 ranks: each rank reads its batches of the one length-grouped order") {
  const auto out = dist_dir("group_by_length_2");
  require_success(launch(2, {"--task", "tokens", "--sharding", "ddp", "--rows", "64", "--per_device_train_batch_size",
                             "4", "--num_train_epochs", "1", "--train_sampling_strategy", "group_by_length",
                             "--include_for_metrics", "inputs,loss", "--seed", "7", "--save_strategy", "no", "--ddp_timeout", "30",
                             "--output_dir", out.string(), "--result", (out / "result").string()},
                         out / "logs"));
  // HF's order for the per-device batch (4 x 1 accumulation step), seeded 7 for epoch 0,
  // cut into batches of 4: rank r reads batches r, r + 2, ...
  const auto lengths = loom_test::RaggedTokens(64, 1234).lengths();
  const auto order = loom::data::length_grouped_order(lengths, 4, loom::data::seeded_permutation(64, 7, 0));
  for (int r = 0; r < 2; ++r) {
    std::vector<int64_t> want;
    for (int64_t k = r; k < 16; k += 2) {
      int64_t sum = 0;
      for (int64_t i = 4 * k; i < 4 * k + 4; ++i) sum += lengths[static_cast<std::size_t>(order[i].item<int64_t>())];
      want.push_back(sum);
    }
    std::ifstream in((out / ("result.rank" + std::to_string(r) + ".json")).string());
    CHECK(nlohmann::json::parse(in).at("batch_tokens").get<std::vector<int64_t>>() == want);
  }
}

TEST_CASE("a stream at 2 ranks: each rank reads its slices; a resume seeks there and ends bitwise") {
  // 100 rows in batches of 8 at 2 ranks, 2 micro-batches a step: an epoch is 6 chunks of 16
  // rows and a short one (4 rows, completed from the epoch's start), 3.5 steps; 10 steps run
  // into the third epoch. Saved every step.
  const auto reads = [](const fs::path& out, int r) {
    std::ifstream in((out / ("result.rank" + std::to_string(r) + ".json")).string());
    return nlohmann::json::parse(in).at("reads").get<std::vector<std::array<int64_t, 2>>>();
  };
  for (const std::string policy : {"ddp", "zero2"}) {
    CAPTURE(policy);
    const auto straight = dist_dir("stream_straight_" + policy);
    auto args = base_args(policy, 8, straight, 10);
    set_flags(args, {{"--task", "stream"}, {"--rows", "100"}, {"--save_strategy", "steps"}, {"--save_steps", "1"}});
    require_success(launch(2, args, straight / "logs"));
    for (int r = 0; r < 2; ++r) {
      // Rank r reads its slice, rows [16k + 8r, 16k + 8r + 8), of each full chunk and no other
      // row; the chunk at the end of an epoch is completed from the epoch's start.
      const auto got = reads(straight, r);
      std::vector<std::array<int64_t, 2>> want;
      for (int64_t e = 0; e < 3; ++e)
        for (int64_t k = 0; k < 7 && static_cast<int64_t>(want.size()) < static_cast<int64_t>(got.size()); ++k) {
          for (int64_t i = 16 * k + 8 * r; i < std::min<int64_t>(16 * k + 8 * r + 8, 100); ++i) want.push_back({e, i});
          if (k == 6)  // the short chunk: positions 4 .. 15 are the epoch's rows 0 .. 11
            for (int64_t i = 0; i < 16; ++i) want.push_back({e, i});
        }
      want.resize(got.size());
      CHECK(nlohmann::json(got).dump() == nlohmann::json(want).dump());
    }
    for (const int step : {3, 4, 6}) {
      CAPTURE(step);
      const auto out = dist_dir("stream_resume_" + policy + "_" + std::to_string(step));
      auto resume = base_args(policy, 8, out, 10);
      set_flags(resume, {{"--task", "stream"}, {"--rows", "100"}, {"--save_strategy", "steps"}, {"--save_steps", "1"},
                         {"--resume_from_checkpoint", (straight / ("checkpoint-" + std::to_string(step))).string()}});
      require_success(launch(2, resume, out / "logs"));
      CHECK(weight_difference(out, straight) == 0.0);
      check_losses(logged_losses(out), logged_losses(straight), 0.0);
      for (int r = 0; r < 2; ++r) {  // the rows the straight run read after that step, no row before
        const auto all = reads(straight, r), resumed = reads(out, r);
        REQUIRE(resumed.size() < all.size());
        CHECK(std::equal(resumed.begin(), resumed.end(), all.end() - static_cast<std::ptrdiff_t>(resumed.size())));
      }
    }
  }
}

TEST_CASE("gradient checkpointing at 2 ranks: FullShard and DDP train as without it") {
  // The worker's MLP has two FullShardUnits. Under FullShard a recomputed unit's forward runs
  // again in backward, after the engine's pre-backward hook gathered its parameters again.
  for (const std::string policy : {"full_shard", "ddp"}) {
    CAPTURE(policy);
    const auto plain = dist_dir("gc_plain_" + policy), recomputed = dist_dir("gc_" + policy);
    require_success(launch(2, base_args(policy, 4, plain), plain / "logs"));
    auto args = base_args(policy, 4, recomputed);
    set_flag(args, "--gradient_checkpointing", "true");
    require_success(launch(2, args, recomputed / "logs"));
    const auto want = logged_losses(plain);
    REQUIRE(want.size() == 10);
    check_losses(logged_losses(recomputed), want, 1e-6);
    const double diff = weight_difference(recomputed, plain);
    MESSAGE(policy << ": final weights differ by " << diff << " (relative)");
    CHECK(diff < 1e-6);
  }
}

TEST_CASE("ddp_broadcast_buffers: each training forward starts from rank 0's buffers") {
  // 4 steps of 2 micro-batches: 8 training forwards; rank r adds r + 1 to the buffer in each.
  for (const std::string broadcast : {"true", "false"}) {
    CAPTURE(broadcast);
    const auto out = dist_dir("buffers_" + broadcast);
    auto args = base_args("ddp", 4, out, 4);
    set_flags(args, {{"--task", "buffers"}, {"--eval_strategy", "no"}, {"--ddp_broadcast_buffers", broadcast}});
    require_success(launch(2, args, out / "logs"));
    std::vector<double> count;
    for (int r = 0; r < 2; ++r) {
      std::ifstream in((out / ("result.rank" + std::to_string(r) + ".json")).string());
      count.push_back(nlohmann::json::parse(in).at("count").get<double>());
    }
    CHECK(count[0] == 8.0);
    // Broadcast: rank 1 starts each forward from rank 0's value (7 of them), then adds 2.
    CHECK(count[1] == (broadcast == "true" ? 9.0 : 16.0));
  }
}

TEST_CASE("ddp_find_unused_parameters at 2 ranks: unused parameters hold back no bucket and are not stepped") {
  // --partly_used: `spare` is never used, `rare` on some ranks and steps only. Hidden 512
  // and 1 MB buckets make three buckets; the first (backward's first) holds head, rare and
  // spare, so without the flag every bucket waits for after_backward. At --learning_rate
  // 1e-3 the float rounding of other batch splits moves the weights by 1.1e-7 (relative;
  // 1.5e-6 at 1e-2); stepping the unused parameters as the flag off does, by 5e-5 (spare)
  // to 1.2e-2 (rare).
  constexpr double lr = 1e-3;
  auto args = [&](const std::string& sharding, int64_t batch, const fs::path& out) {
    auto a = base_args(sharding, batch, out);
    set_flags(a, {{"--partly_used", "true"}, {"--hidden", "512"}, {"--ddp_bucket_cap_mb", "1"},
                  {"--eval_strategy", "no"}, {"--learning_rate", "1e-3"}});
    return a;
  };
  const auto ref = dist_dir("unused_ref");
  require_success(launch(1, args("no", 8, ref), ref / "logs", false));
  const auto want = weights(ref);
  REQUIRE(want.contains("spare.weight"));
  auto rank_json = [](const fs::path& out, int r) {
    std::ifstream in((out / ("result.rank" + std::to_string(r) + ".json")).string());
    return nlohmann::json::parse(in);
  };
  for (const std::string policy : {"ddp", "zero1", "zero2"}) {
    CAPTURE(policy);
    // Collectives per run: 3 buckets on each syncing micro-step (the last of each of the 10
    // groups; every one of the 20 under ZeRO-2).
    const int64_t launches = policy == "zero2" ? 60 : 30;
    {
      const auto out = dist_dir("unused_on_" + policy);
      auto a = args(policy, 4, out);
      set_flag(a, "--ddp_find_unused_parameters", "true");
      require_success(launch(2, a, out / "logs"));
      const auto r0 = rank_json(out, 0), r1 = rank_json(out, 1);
      for (const auto& r : {r0, r1}) {
        CHECK(r.at("launched_during_backward").get<int64_t>() == launches);
        CHECK(r.at("launched_after_backward").get<int64_t>() == 0);
      }
      // The data make both cases happen: a micro-step where one rank reaches `rare` and the
      // other does not, and a step (2 micro-steps) where no rank does.
      const auto u0 = r0.at("rare_used").get<std::vector<int>>(), u1 = r1.at("rare_used").get<std::vector<int>>();
      REQUIRE(u0.size() == 20);
      REQUIRE(u1.size() == 20);
      bool one_rank = false, no_rank = false;
      for (std::size_t i = 0; i < 20; ++i) one_rank = one_rank || u0[i] != u1[i];
      for (std::size_t i = 0; i < 20; i += 2) no_rank = no_rank || u0[i] + u0[i + 1] + u1[i] + u1[i + 1] == 0;
      REQUIRE(one_rank);
      REQUIRE(no_rank);
      // As one process on the global batch: `spare` never stepped (no weight decay), `rare`
      // skipped on the steps no rank used it (no moment update).
      const double diff = weight_difference(out, ref);
      MESSAGE(policy << " with the flag: final weights differ from one process by " << diff << " (relative)");
      CHECK(diff < 1e-6);
      const auto got = weights(out);
      CHECK(torch::equal(got.at("spare.weight"), want.at("spare.weight")));
      CHECK(torch::equal(got.at("spare.bias"), want.at("spare.bias")));
    }
    {
      // Off (DDP: left unset, the default): no hang; every bucket waits for after_backward,
      // and `spare` takes each step's weight decay with its zero gradient (AdamW:
      // p *= 1 - lr * wd; lr falls linearly over the 10 steps).
      const auto out = dist_dir("unused_off_" + policy);
      auto a = args(policy, 4, out);
      if (policy != "ddp") set_flag(a, "--ddp_find_unused_parameters", "false");
      const auto l = launch(2, a, out / "logs", true, 60);
      require_success(l);
      for (int r = 0; r < 2; ++r) {
        const auto j = rank_json(out, r);
        CHECK(j.at("launched_during_backward").get<int64_t>() == 0);
        CHECK(j.at("launched_after_backward").get<int64_t>() == launches);
      }
      const auto got = weights(out);
      double factor = 1.0;
      for (int t = 0; t < 10; ++t) factor *= 1.0 - lr * (10.0 - t) / 10.0 * 0.01;
      const auto decayed = want.at("spare.weight") * factor;
      CHECK((got.at("spare.weight") - decayed).abs().max().item<double>() <= 5e-8);
      CHECK_FALSE(torch::equal(got.at("spare.weight"), want.at("spare.weight")));
    }
  }
  // FullShard has nothing to do with the flag and says so (training goes on).
  const auto fs_out = dist_dir("unused_full_shard");
  auto fs_args = args("full_shard", 4, fs_out);
  set_flags(fs_args, {{"--ddp_find_unused_parameters", "true"}, {"--max_steps", "2"}});
  const auto fs_run = launch(2, fs_args, fs_out / "logs", true, 60);
  require_success(fs_run);
  for (const auto& err : fs_run.err)
    CHECK(err.find("loom: warning: --ddp_find_unused_parameters has no effect under --sharding full_shard") !=
          std::string::npos);

  // Two backward passes in one reducing micro-step: with the flag every bucket is launched
  // during the first, so the second one's gradients arrive too late; each rank stops with a
  // loom: line instead of a wrong sum. (Without it `spare` holds every bucket back to
  // after_backward, and the two passes sum correctly.)
  const auto twice = dist_dir("unused_backward_twice");
  auto a = args("ddp", 4, twice);
  set_flags(a, {{"--backward_twice", "true"}, {"--ddp_find_unused_parameters", "true"}});
  const auto l = launch(2, a, twice / "logs", true, 60);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " stderr:\n" << l.err[static_cast<std::size_t>(r)]);
    CHECK(l.status[static_cast<std::size_t>(r)] == 2);
    CHECK(l.err[static_cast<std::size_t>(r)].find("arrived after its bucket had been reduced: backward ran more than "
                                                  "once in one micro-step under --sharding ddp") != std::string::npos);
  }
}

TEST_CASE("a loop written on loom::Accelerator at 2 ranks reproduces the Trainer; each resumes the other's checkpoint") {
  // ZeRO-2 and FullShard in fp32, ZeRO-2 in bf16: logged losses, the evaluation's gathered
  // (position-weighted) accuracy and the final weights, 1e-6.
  for (const auto& [policy, precision] : std::vector<std::pair<std::string, std::string>>{
           {"zero2", "no"}, {"full_shard", "no"}, {"zero2", "bf16"}}) {
    INFO(policy << " " << precision);
    const auto tag = policy + "_" + precision;
    auto common = [&](const fs::path& out) {
      auto a = base_args(policy, 4, out);
      set_flags(a, {{"--save_strategy", "steps"}, {"--save_steps", "5"}});
      if (precision == "bf16") set_flag(a, "--bf16", "true");
      return a;
    };
    const auto trainer_dir = dist_dir("acc_trainer_" + tag), plain_dir = dist_dir("acc_plain_" + tag);
    require_success(launch(2, common(trainer_dir), trainer_dir / "logs"));
    auto plain = common(plain_dir);
    set_flag(plain, "--loop", "accelerator");
    require_success(launch(2, plain, plain_dir / "logs"));
    const auto want = logged_losses(trainer_dir);
    REQUIRE(want.size() == 10);
    check_losses(logged_losses(plain_dir), want, 1e-6);
    const auto acc_want = logged(trainer_dir, "eval_ordered_accuracy");
    REQUIRE(acc_want.size() == 2);
    CHECK(logged(plain_dir, "eval_ordered_accuracy") == acc_want);
    CHECK(logged(plain_dir, "eval_accuracy") == logged(trainer_dir, "eval_accuracy"));
    CHECK(weight_difference(plain_dir, trainer_dir) <= 1e-6);
    if (precision != "no" || policy != "zero2") continue;
    // Each resumes the other's checkpoint-5 (sharded optimizer files) and ends where both did.
    const auto plain_resumed = dist_dir("acc_plain_resumed"), trainer_resumed = dist_dir("acc_trainer_resumed");
    auto a = common(plain_resumed);
    set_flags(a, {{"--loop", "accelerator"}, {"--resume_from_checkpoint", (trainer_dir / "checkpoint-5").string()}});
    require_success(launch(2, a, plain_resumed / "logs"));
    CHECK(weight_difference(plain_resumed, trainer_dir) <= 1e-6);
    check_losses(logged_losses(plain_resumed), want, 1e-6);
    auto b = common(trainer_resumed);
    set_flag(b, "--resume_from_checkpoint", (plain_dir / "checkpoint-5").string());
    require_success(launch(2, b, trainer_resumed / "logs"));
    CHECK(weight_difference(trainer_resumed, trainer_dir) <= 1e-6);
    check_losses(logged_losses(trainer_resumed), want, 1e-6);
  }
}

TEST_CASE("a GAN with two optimizers at 2 ranks resumes bitwise under DDP, ZeRO-1, ZeRO-2 and FullShard") {
  // tests/gan_loop.hpp: 6 steps straight (saving at 3), then 3 more resumed from checkpoint-3,
  // whose files hold each optimizer's shards apart.
  for (const std::string policy : {"ddp", "zero1", "zero2", "full_shard"}) {
    INFO(policy);
    const auto straight = dist_dir("gan_" + policy), resumed = dist_dir("gan_resumed_" + policy);
    auto a = base_args(policy, 8, straight);
    set_flags(a, {{"--save_strategy", "steps"}, {"--save_steps", "3"}, {"--eval_strategy", "no"}, {"--loop", "gan"}});
    require_success(launch(2, a, straight / "logs"));
    const auto ckpt = straight / "checkpoint-3";
    const bool sharded = policy != "ddp";
    for (const std::string stem : {"optimizer", "optimizer_1"}) {
      INFO(stem);
      CHECK(fs::exists(ckpt / (stem + ".json")));
      if (sharded)
        for (int r = 0; r < 2; ++r) CHECK(fs::exists(ckpt / (stem + "-" + std::to_string(r) + "-of-2.safetensors")));
      else
        CHECK(fs::exists(ckpt / (stem + ".safetensors")));
    }
    CHECK(fs::exists(ckpt / "scheduler_1.json"));
    auto b = base_args(policy, 8, resumed);
    set_flags(b, {{"--eval_strategy", "no"}, {"--loop", "gan"}, {"--resume_from_checkpoint", ckpt.string()}});
    require_success(launch(2, b, resumed / "logs"));
    CHECK(weight_difference(resumed, straight) == 0.0);
    auto read = [](const fs::path& dir) {
      std::ifstream in((dir / "result.rank0.json").string());
      return nlohmann::json::parse(in);
    };
    const auto want = read(straight), got = read(resumed);
    for (const char* key : {"d_losses", "g_losses", "d_lrs", "g_lrs"}) {
      INFO(key);
      const auto w = want.at(key).get<std::vector<double>>(), g = got.at(key).get<std::vector<double>>();
      REQUIRE(w.size() == 6);
      CHECK(g == std::vector<double>(w.begin() + 3, w.end()));
    }
  }
}

TEST_CASE("several processes under --sharding no stop at start-up with a loom: line") {
  const auto out = dist_dir("no_sharding_2");
  const auto l = launch(2, base_args("no", 4, out), out / "logs");
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " stderr:\n" << l.err[static_cast<std::size_t>(r)]);
    CHECK(l.status[static_cast<std::size_t>(r)] == 2);
    CHECK(l.err[static_cast<std::size_t>(r)].find("loom: WORLD_SIZE is 2 but this Trainer does not shard") !=
          std::string::npos);
  }
  CHECK_FALSE(fs::exists(out / "trainer_state.json"));
}

TEST_CASE("several processes without --sharding train under DDP, as HF's Trainer does under torchrun") {
  const auto ddp = dist_dir("auto_ddp_2"), unset = dist_dir("auto_unset_2");
  require_success(launch(2, base_args("ddp", 4, ddp), ddp / "logs"));
  auto args = base_args("auto", 4, unset);
  args.erase(args.begin(), args.begin() + 2);  // no --sharding at all
  REQUIRE(std::find(args.begin(), args.end(), "--sharding") == args.end());
  require_success(launch(2, args, unset / "logs"));
  CHECK(logged_losses(unset) == logged_losses(ddp));
  CHECK(weight_difference(unset, ddp) == 0.0);
  std::ifstream saved((unset / "result.model" / "training_args.json").string());
  CHECK(nlohmann::json::parse(saved).at("sharding") == "ddp");
}

TEST_CASE("a rank that stops answering makes the others fail once ddp_timeout has passed") {
  const auto out = dist_dir("hang_2_1");
  auto args = base_args("zero2", 4, out, 20);
  set_flags(args, {{"--die_rank", "1"}, {"--die_step", "4"}, {"--hang", "true"}, {"--ddp_timeout", "5"}});
  const auto l = launch(2, args, out / "logs", true, 90, /*stopped_rank=*/1);
  INFO("rank 0 stderr:\n" << l.err[0]);
  CHECK(l.status[0] == 2);
  CHECK(l.err[0].find("loom: rank 0 lost rank 1") != std::string::npos);
  MESSAGE("rank 1 stopped; rank 0 ended after " << l.seconds << " s with ddp_timeout 5 s");
  CHECK(l.seconds >= 5);
  CHECK(l.seconds < 30);
}

int main(int argc, char** argv) {
  if (std::getenv("LOOM_DIST_WORKER") != nullptr) return worker::run(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
