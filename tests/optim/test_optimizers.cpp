// Every --optim rule against Python step by step (torch.optim's SGD, Adagrad, RMSprop and
// AdamW, HF's Adafactor, and a Lion written out in tests/optim/reference.py), with two groups
// that differ in lr and weight decay and a learning rate that changes every step; the state
// round trip through a safetensors file (a resume is bitwise); the elementwise rules over flat
// pieces (what ZeRO steps) equal the rule over whole tensors; a wrapped torch::optim optimizer;
// --optim_args errors.
#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/optim_args.hpp>
#include <loom/config/validate.hpp>
#include <loom/optim/optimizer.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace {

using loom::optim::Optimizer;

// One comparison: the loom side is configured from --optim / --optim_args (HF's path), the
// Python side from the same values as keyword arguments.
struct Case {
  std::string optim, optim_args;
  nlohmann::json kwargs;
};

constexpr double kBaseLr = 0.05;
const std::vector<double> kFactors = {1.0, 0.5, 0.25, 0.8, 1.0};
constexpr int kSteps = 5;

// p0 [5, 3] and p2 [2, 3, 4] in group 0 (weight decay 0.1, its own lr 0.02); p1 [3] in group 1
// (no decay, the scheduler's lr). Gradients g<i>.<s> for every step.
std::map<std::string, torch::Tensor> make_inputs() {
  torch::manual_seed(11);
  std::map<std::string, torch::Tensor> t;
  const std::vector<std::vector<int64_t>> shapes = {{5, 3}, {3}, {2, 3, 4}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    t[fmt::format("p{}", i)] = torch::randn(shapes[i]);
    for (int s = 0; s < kSteps; ++s) t[fmt::format("g{}.{}", i, s)] = torch::randn(shapes[i]);
  }
  return t;
}

nlohmann::json groups_json() {
  return nlohmann::json::array({{{"params", {0, 2}}, {"weight_decay", 0.1}, {"lr", 0.02}},
                                {{"params", {1}}, {"weight_decay", 0.0}, {"lr", nullptr}}});
}

// The loom optimizer for `c` over `params` (p0, p1, p2), grouped as groups_json() says.
Optimizer make_loom(const Case& c, const std::vector<torch::Tensor>& params) {
  loom::TrainingArguments args;
  args.optim = c.optim;
  if (!c.optim_args.empty()) args.optim_args = c.optim_args;
  loom::validate(args);
  std::vector<loom::optim::ParamGroup> groups(2);
  groups[0].params = {params[0], params[2]};
  groups[0].names = {"p0", "p2"};
  groups[0].weight_decay = 0.1;
  groups[0].lr = 0.02;
  groups[1].params = {params[1]};
  groups[1].names = {"p1"};
  Optimizer opt(groups, loom::optim::options_from_args(args));
  opt.set_base_lr(kBaseLr);
  return opt;
}

std::vector<torch::Tensor> leaf_copies(const std::map<std::string, torch::Tensor>& in) {
  std::vector<torch::Tensor> out;
  for (int i = 0; i < 3; ++i) out.push_back(in.at(fmt::format("p{}", i)).clone().requires_grad_(true));
  return out;
}

// Steps `opt` over `params` for steps [from, to), recording the parameters after each.
void run_steps(Optimizer& opt, std::vector<torch::Tensor>& params, const std::map<std::string, torch::Tensor>& in,
               int from, int to, std::map<std::string, torch::Tensor>* record) {
  for (int s = from; s < to; ++s) {
    for (int i = 0; i < 3; ++i)
      params[i].mutable_grad() = in.at(fmt::format("g{}.{}", i, s)).clone();
    opt.step(kBaseLr * kFactors[s]);
    opt.zero_grad();
    if (record)
      for (int i = 0; i < 3; ++i) (*record)[fmt::format("p{}.{}", i, s)] = params[i].detach().clone();
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"sgd", "", nlohmann::json::object()},
      {"sgd", "momentum=0.9, dampening=0.1", {{"momentum", 0.9}, {"dampening", 0.1}}},
      {"sgd", "momentum=0.8,nesterov=True", {{"momentum", 0.8}, {"nesterov", true}}},
      {"adagrad", "", nlohmann::json::object()},
      {"adagrad", "lr_decay=0.05,initial_accumulator_value=0.1,eps=1e-6",
       {{"lr_decay", 0.05}, {"initial_accumulator_value", 0.1}, {"eps", 1e-6}}},
      {"rmsprop", "", nlohmann::json::object()},
      {"rmsprop", "momentum=0.9,alpha=0.95,centered=True,eps=1e-6",
       {{"momentum", 0.9}, {"alpha", 0.95}, {"centered", true}, {"eps", 1e-6}}},
      {"adamw_torch", "", nlohmann::json::object()},
      {"adamw_torch_fused", "", nlohmann::json::object()},
      {"lion", "", nlohmann::json::object()},
      {"lion", "beta1=0.95,beta2=0.98", {{"betas", {0.95, 0.98}}}},
      {"adafactor", "", nlohmann::json::object()},
      {"adafactor", "beta1=0.9,clip_threshold=0.5,decay_rate=-0.6",
       {{"beta1", 0.9}, {"clip_threshold", 0.5}, {"decay_rate", -0.6}}},
  };
  return all;
}

}  // namespace

TEST_CASE("every --optim rule matches Python's torch.optim / HF step by step (1e-6), per-group lr and decay") {
  const char* py = loom_test::python("the comparison with torch.optim");
  if (py == nullptr) return;
  const auto dir = loom_test::fresh_dir("optim/reference");
  const auto inputs = make_inputs();
  loom::checkpoint::save_safetensors({inputs.begin(), inputs.end()}, dir / "in.safetensors");
  nlohmann::json configs = nlohmann::json::array();
  for (const auto& c : cases())
    configs.push_back({{"optim", c.optim}, {"base_lr", kBaseLr}, {"kwargs", c.kwargs}, {"factors", kFactors},
                       {"groups", groups_json()}});
  const std::string cmd = std::string(py) + " " + (loom_test::source_dir() / "tests/optim/reference.py").string() + " " +
                          (dir / "in.safetensors").string() + " " + (dir / "out").string() + " '" + configs.dump() +
                          "' 2>&1";
  const auto log = loom_test::run_capture(cmd);
  INFO(log);
  for (std::size_t k = 0; k < cases().size(); ++k) {
    const auto& c = cases()[k];
    INFO(c.optim << " --optim_args '" << c.optim_args << "'");
    const auto out = dir / (fmt::format("out{}.safetensors", k));
    REQUIRE(std::filesystem::exists(out));
    std::map<std::string, torch::Tensor> expected;
    for (auto& [k, t] : loom::checkpoint::load_safetensors(out)) expected[k] = t;

    auto params = leaf_copies(inputs);
    auto opt = make_loom(c, params);
    std::map<std::string, torch::Tensor> got;
    run_steps(opt, params, inputs, 0, kSteps, &got);
    double worst = 0.0;
    for (const auto& [k, t] : expected) {
      REQUIRE(got.count(k) == 1);
      worst = std::max(worst, (got.at(k) - t).abs().max().item<double>());
    }
    CHECK(expected.size() == static_cast<std::size_t>(3 * kSteps));
    CHECK(worst <= 1e-6);
    MESSAGE(c.optim << " --optim_args '" << c.optim_args << "': largest difference from Python " << worst);
    // The parameters moved, and the two groups differently from one plain lr.
    CHECK_FALSE(torch::allclose(got.at("p0.4"), inputs.at("p0")));
    CHECK_FALSE(torch::allclose(got.at("p1.4"), inputs.at("p1")));
  }
}

TEST_CASE("optimizer state through a safetensors file resumes bitwise, for every rule") {
  const auto dir = loom_test::fresh_dir("optim/state");
  const auto inputs = make_inputs();
  for (const auto& c : cases()) {
    INFO(c.optim << " --optim_args '" << c.optim_args << "'");
    auto straight_params = leaf_copies(inputs);
    auto straight = make_loom(c, straight_params);
    run_steps(straight, straight_params, inputs, 0, kSteps, nullptr);

    auto first_params = leaf_copies(inputs);
    auto first = make_loom(c, first_params);
    run_steps(first, first_params, inputs, 0, 2, nullptr);
    const auto state = first.state_tensors();
    const bool stateless = c.optim == "sgd" && c.optim_args.empty();
    CHECK(state.empty() == stateless);
    loom::checkpoint::save_safetensors(state, dir / "opt.safetensors");
    const auto meta = first.state_meta();

    std::vector<torch::Tensor> resumed_params;
    for (auto& p : first_params) resumed_params.push_back(p.detach().clone().requires_grad_(true));
    auto resumed = make_loom(c, resumed_params);
    std::vector<std::pair<std::string, torch::Tensor>> loaded;
    if (!state.empty()) loaded = loom::checkpoint::load_safetensors(dir / "opt.safetensors");
    resumed.load_state(loaded, meta);
    CHECK(resumed.steps() == 2);
    run_steps(resumed, resumed_params, inputs, 2, kSteps, nullptr);
    for (int i = 0; i < 3; ++i) CHECK(torch::equal(resumed_params[i], straight_params[i]));
  }
}

TEST_CASE("a state file that does not fit is a loom: error naming the tensor") {
  const auto inputs = make_inputs();
  Case adafactor{"adafactor", "", nlohmann::json::object()};
  auto params = leaf_copies(inputs);
  auto opt = make_loom(adafactor, params);
  run_steps(opt, params, inputs, 0, 1, nullptr);
  auto state = opt.state_tensors();
  for (auto& [k, t] : state)
    if (k == "exp_avg_sq_row.p0") t = torch::zeros({3});
  auto fresh = make_loom(adafactor, params);
  CHECK(loom_test::error_of([&] { fresh.load_state(state, opt.state_meta()); }) ==
        "loom: the optimizer state does not match the model: shape of exp_avg_sq_row.p0 differs");
  // Another rule's checkpoint.
  auto lion = make_loom({"lion", "", nlohmann::json::object()}, params);
  CHECK(loom_test::error_of([&] { lion.load_state(state, opt.state_meta()); }) ==
        "loom: the checkpoint's optimizer is adafactor but this run's is lion; resume with the same --optim (or "
        "create_optimizer)");
}

TEST_CASE("the elementwise rules over flat pieces of the parameters (as ZeRO steps them) equal whole tensors") {
  const auto inputs = make_inputs();
  for (const auto& c : cases()) {
    INFO(c.optim << " --optim_args '" << c.optim_args << "'");
    auto whole = leaf_copies(inputs);
    auto opt_whole = make_loom(c, whole);
    if (!opt_whole.steps_pieces()) continue;
    run_steps(opt_whole, whole, inputs, 0, kSteps, nullptr);

    // Each parameter cut in two flat pieces at an odd place, one group per original group.
    std::vector<torch::Tensor> storage;
    for (int i = 0; i < 3; ++i) storage.push_back(inputs.at(fmt::format("p{}", i)).clone().reshape({-1}));
    std::vector<torch::Tensor> pieces;
    std::vector<std::pair<int, std::pair<int64_t, int64_t>>> where;
    loom::TrainingArguments args;
    args.optim = c.optim;
    if (!c.optim_args.empty()) args.optim_args = c.optim_args;
    std::vector<loom::optim::ParamGroup> groups(2);
    groups[0].weight_decay = 0.1;
    groups[0].lr = 0.02;
    for (int i : {0, 2, 1}) {
      const int64_t n = storage[i].numel(), cut = n / 2 + 1;
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, cut}, {cut, n}}) {
        auto& g = groups[i == 1 ? 1 : 0];
        g.params.push_back(storage[i].narrow(0, b, e - b));
        g.names.push_back(fmt::format("p{}[{}]", i, b));
        where.push_back({i, {b, e}});
      }
    }
    Optimizer opt(groups, loom::optim::options_from_args(args));
    opt.set_base_lr(kBaseLr);
    for (int s = 0; s < kSteps; ++s) {
      std::size_t k = 0;
      for (auto& g : groups)
        for (auto& p : g.params) {
          const auto [i, range] = where[k++];
          p.mutable_grad() = inputs.at(fmt::format("g{}.{}", i, s)).reshape({-1}).narrow(
              0, range.first, range.second - range.first).clone();
        }
      opt.step(kBaseLr * kFactors[s]);
    }
    for (int i = 0; i < 3; ++i)
      CHECK((storage[i] - whole[i].detach().reshape({-1})).abs().max().item<double>() <= 1e-6);
  }
}

TEST_CASE("a wrapped torch::optim optimizer steps each group at its lr times the schedule's factor") {
  const auto inputs = make_inputs();
  auto params = leaf_copies(inputs);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[2]}, std::make_unique<torch::optim::SGDOptions>(0.02));
  groups.emplace_back(std::vector<torch::Tensor>{params[1]}, std::make_unique<torch::optim::SGDOptions>(kBaseLr));
  auto opt = Optimizer::wrap(std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(kBaseLr)));
  opt.set_base_lr(kBaseLr);
  CHECK_FALSE(opt.steps_pieces());
  CHECK(opt.parameters().size() == 3);
  // The same steps by hand: plain SGD at 0.02 * f and 0.05 * f.
  std::vector<torch::Tensor> expected;
  for (int i = 0; i < 3; ++i) expected.push_back(inputs.at(fmt::format("p{}", i)).clone());
  for (int s = 0; s < kSteps; ++s)
    for (int i = 0; i < 3; ++i)
      expected[i] -= (i == 1 ? kBaseLr : 0.02) * kFactors[s] * inputs.at(fmt::format("g{}.{}", i, s));
  run_steps(opt, params, inputs, 0, kSteps, nullptr);
  for (int i = 0; i < 3; ++i) CHECK((params[i].detach() - expected[i]).abs().max().item<double>() <= 1e-6);
  CHECK_FALSE(params[0].grad().defined());  // zero_grad went through torch's
  CHECK(opt.steps() == kSteps);
  CHECK(opt.state_tensors().empty());
  CHECK(loom_test::error_of([] { (void)Optimizer::wrap(nullptr); }) ==
        "loom: Optimizer::wrap needs a torch::optim::Optimizer, got null");
}

TEST_CASE("--optim_args: HF's keys per optimizer; anything else is a loom: error at start-up") {
  const auto sgd = loom::parse_optim_args("sgd", " momentum = 0.9 ,nesterov=True");
  REQUIRE(sgd.size() == 2);
  CHECK(sgd[0] == std::pair<std::string, double>{"momentum", 0.9});
  CHECK(sgd[1] == std::pair<std::string, double>{"nesterov", 1.0});
  CHECK(loom::parse_optim_args("rmsprop", "centered=no,alpha=0.9").front().second == 0.0);
  CHECK(loom::parse_optim_args("adamw_torch", "").empty());
  auto err = [](std::string optim, std::string text) {
    return loom_test::error_of([&] {
      loom::TrainingArguments a;
      a.optim = optim;
      a.optim_args = text;
      loom::validate(a);
    });
  };
  CHECK(err("sgd", "momentum") ==
        "loom: --optim_args must be key=value pairs separated by commas such as 'momentum=0.9,nesterov=True', got "
        "'momentum' in 'momentum'");
  CHECK(err("sgd", "momentum=0.9,") ==
        "loom: --optim_args must be key=value pairs separated by commas such as 'momentum=0.9,nesterov=True', got "
        "'' in 'momentum=0.9,'");
  CHECK(err("sgd", "momentom=0.9") == "loom: --optim_args key 'momentom' is not read by --optim sgd; it reads "
                                      "momentum, dampening, nesterov");
  CHECK(err("adamw_torch", "eps=1") ==
        "loom: --optim_args key 'eps' is not read by --optim adamw_torch, which takes no --optim_args");
  CHECK(err("sgd", "momentum=fast") == "loom: --optim_args momentum must be a number, got 'fast'");
  CHECK(err("sgd", "momentum=-1") == "loom: --optim_args momentum must be >= 0, got -1");
  CHECK(err("lion", "beta1=1.5") == "loom: --optim_args beta1 must be in [0, 1], got 1.5");
  CHECK(err("sgd", "nesterov=maybe") == "loom: --optim_args nesterov must be True or False, got 'maybe'");
  CHECK(err("sgd", "momentum=0.9,momentum=0.8") == "loom: --optim_args gives 'momentum' twice");
  CHECK(err("sgd", "nesterov=True") ==
        "loom: --optim_args nesterov=True needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  CHECK(err("rmsprop", "weight_decay=0.1") ==
        "loom: --optim_args weight_decay has no effect (the decay groups carry their own, as in HF); use "
        "--weight_decay");
  CHECK(err("sgd", "momentum=0.9,nesterov=True") == "<no loom::Error>");
}

TEST_CASE("an fp16 overflow flag skips the step of every rule: parameters, state and step count unchanged") {
  const auto inputs = make_inputs();
  for (const auto& c : cases()) {
    INFO(c.optim << " --optim_args '" << c.optim_args << "'");
    auto params = leaf_copies(inputs);
    auto opt = make_loom(c, params);
    run_steps(opt, params, inputs, 0, 1, nullptr);
    std::vector<torch::Tensor> before_params, before_state;
    for (auto& p : params) before_params.push_back(p.detach().clone());
    for (const auto& [k, t] : opt.state_tensors()) before_state.push_back(t.clone());
    for (int i = 0; i < 3; ++i) params[i].mutable_grad() = inputs.at(fmt::format("g{}.1", i)).clone();
    opt.step(kBaseLr, torch::ones({1}));
    // The fused kernel skips on the device, so the host's count includes the call (its step
    // tensors, compared below, do not).
    const bool on_device = c.optim == "adamw_torch_fused";
    CHECK(opt.steps() == (on_device ? 2 : 1));
    for (int i = 0; i < 3; ++i) CHECK(torch::equal(params[i].detach(), before_params[i]));
    const auto after = opt.state_tensors();
    REQUIRE(after.size() == before_state.size());
    for (std::size_t k = 0; k < after.size(); ++k) CHECK(torch::equal(after[k].second, before_state[k]));
    // A zero flag steps.
    opt.step(kBaseLr, torch::zeros({1}));
    CHECK(opt.steps() == (on_device ? 3 : 2));
    CHECK_FALSE(torch::equal(params[0].detach(), before_params[0]));
  }
}
