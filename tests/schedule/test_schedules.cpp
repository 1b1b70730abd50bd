// Learning-rate schedules: every lr_scheduler_type against the real transformers package
// (get_scheduler stepped in Python, rates compared step by step), plus hand-computed
// values, kwargs errors and state round trips.
#include <loom/schedule/from_args.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "../support.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numbers>
#include <string>

using namespace loom::schedule;

namespace {
ScheduleParams params(int64_t warmup, int64_t total, double lr = 1.0, nlohmann::json kwargs = nlohmann::json::object()) {
  return ScheduleParams{warmup, total, lr, std::move(kwargs)};
}

using loom_test::run_capture;
}  // namespace

TEST_CASE("linear schedule with warmup: HF's lr_lambda by hand") {
  LRScheduler<Linear> s(params(2, 10));
  const double expected[] = {0.0, 0.5, 1.0, 7.0 / 8, 6.0 / 8, 5.0 / 8, 4.0 / 8, 3.0 / 8, 2.0 / 8, 1.0 / 8, 0.0, 0.0};
  for (int step = 0; step < 12; ++step) CHECK(s.lr_at(step) == doctest::Approx(expected[step]));
  CHECK(s.current_lr() == 0.0);
  s.step();
  s.step();
  s.step();
  CHECK(s.current_lr() == doctest::Approx(7.0 / 8));
  CHECK(LRScheduler<Linear>(params(2, 10, 3e-4)).lr_at(4) == doctest::Approx(3e-4 * 6.0 / 8));
  CHECK(LRScheduler<Linear>(params(0, 4)).lr_at(0) == doctest::Approx(1.0));
}

TEST_CASE("constant, constant_with_warmup and cosine by hand") {
  CHECK(LRScheduler<Constant>(params(4, 20, 0.1)).lr_at(19) == doctest::Approx(0.1));
  CHECK(LRScheduler<ConstantWithWarmup>(params(4, 20)).lr_at(1) == doctest::Approx(0.25));
  CHECK(LRScheduler<ConstantWithWarmup>(params(4, 20)).lr_at(10) == doctest::Approx(1.0));
  LRScheduler<Cosine> c(params(4, 20));
  CHECK(c.lr_at(2) == doctest::Approx(0.5));
  CHECK(c.lr_at(12) == doctest::Approx(0.5));
  CHECK(c.lr_at(20) == doctest::Approx(0.0).epsilon(1e-12));
  CHECK(c.lr_at(7) == doctest::Approx(0.5 * (1 + std::cos(std::numbers::pi * 3.0 / 16.0))));
}

TEST_CASE("warmup resolution: integer steps, fraction below 1, warmup_ratio") {
  CHECK(resolve_warmup_steps(10, 0.0, 100) == 10);
  CHECK(resolve_warmup_steps(0.1, 0.0, 95) == 10);  // ceil(9.5)
  CHECK(resolve_warmup_steps(0, 0.25, 10) == 3);    // ceil(2.5)
  CHECK(resolve_warmup_steps(0, 0.0, 10) == 0);
  CHECK_THROWS_WITH_AS(resolve_warmup_steps(1e24, 0.0, 10), "loom: --warmup_steps 1e+24 is not a step count below 1e15",
                       loom::Error);
}

TEST_CASE("every lr_scheduler_type equals transformers.get_scheduler step by step") {
  const char* py = loom_test::python("transformers cross-check");
  if (py == nullptr) return;
  struct Case {
    std::string name;
    int64_t warmup, total;
    std::string kwargs;
  };
  const std::vector<Case> cases{
      {"linear", 5, 40, "{}"},
      {"cosine", 5, 40, "{}"},
      {"cosine", 3, 40, R"({"num_cycles": 1.5})"},
      {"cosine_with_restarts", 4, 40, R"({"num_cycles": 3})"},
      {"polynomial", 5, 40, R"({"lr_end": 1e-5, "power": 2.0})"},
      {"constant", 5, 40, "{}"},
      {"constant_with_warmup", 7, 40, "{}"},
      {"inverse_sqrt", 6, 40, "{}"},
      {"inverse_sqrt", 0, 40, R"({"timescale": 8})"},
      {"cosine_with_min_lr", 5, 40, R"({"min_lr_rate": 0.1})"},
      {"cosine_with_min_lr", 5, 40, R"({"min_lr": 1e-4})"},
      {"cosine_warmup_with_min_lr", 5, 40, R"({"min_lr_rate": 0.05})"},
      {"cosine_warmup_with_min_lr", 5, 40, R"({"min_lr": 1e-4, "warmup_lr_rate": 0.2})"},
      {"warmup_stable_decay", 5, 40, R"({"num_decay_steps": 10})"},
      {"warmup_stable_decay", 6, 40,
       R"({"num_decay_steps": 12, "num_stable_steps": 15, "warmup_type": "cosine", "decay_type": "1-sqrt", "min_lr_ratio": 0.1})"},
      {"warmup_stable_decay", 4, 40, R"({"num_decay_steps": 20, "warmup_type": "1-sqrt", "decay_type": "linear"})"},
  };
  const double lr = 1e-3;
  // One Python process for every case (importing transformers costs ~3 s a process): each
  // case gets its own optimizer and get_scheduler, as when each ran in a process of its own.
  nlohmann::json all_cases = nlohmann::json::array();
  for (const auto& c : cases) all_cases.push_back({c.name, c.warmup, c.total, nlohmann::json::parse(c.kwargs)});
  const std::string script =
      "import json, sys, torch, warnings\n"
      "warnings.simplefilter('ignore')\n"
      "from transformers import get_scheduler\n"
      "result = []\n"
      "for name, w, t, kw in json.loads(sys.argv[1]):\n"
      "    p = torch.nn.Parameter(torch.zeros(1))\n"
      "    opt = torch.optim.SGD([p], lr=" + std::to_string(lr) + ")\n"
      "    s = get_scheduler(name, opt, num_warmup_steps=w, num_training_steps=t, scheduler_specific_kwargs=kw)\n"
      "    out = []\n"
      "    for _ in range(t + 3):\n"
      "        out.append(opt.param_groups[0]['lr']); opt.step(); s.step()\n"
      "    result.append(out)\n"
      "print(json.dumps(result))\n";
  const auto all_expected =
      nlohmann::json::parse(run_capture(std::string(py) + " -c \"" + script + "\" '" + all_cases.dump() + "'"));
  REQUIRE(all_expected.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    INFO(c.name << " " << c.kwargs);
    const auto& expected = all_expected[i];
    LRScheduler<FromArgs> s(params(c.warmup, c.total, lr, nlohmann::json::parse(c.kwargs)), c.name);
    REQUIRE(expected.size() == static_cast<std::size_t>(c.total + 3));
    for (std::size_t step = 0; step < expected.size(); ++step) {
      INFO("step " << step);
      CHECK(s.current_lr() == doctest::Approx(expected[step].get<double>()).epsilon(1e-9).scale(lr));
      s.step();
    }
  }
}

TEST_CASE("DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR equal DeepSpeed's classes bit for bit") {
  const char* py = loom_test::python("DeepSpeed schedule cross-check");
  if (py == nullptr) return;
  struct Case {
    std::string name, type;
    int64_t warmup, total;
    std::string kwargs;  // also the DeepSpeed params
  };
  const std::vector<Case> cases{
      {"warmup_lr", "WarmupLR", 10, 30, "{}"},
      {"warmup_lr", "WarmupLR", 7, 30, R"({"warmup_type": "linear", "warmup_min_lr": 1e-5})"},
      {"warmup_lr", "WarmupLR", 0, 12, R"({"warmup_type": "linear"})"},
      {"warmup_decay_lr", "WarmupDecayLR", 10, 40, "{}"},
      {"warmup_decay_lr", "WarmupDecayLR", 5, 40, R"({"warmup_type": "linear", "warmup_min_lr": 2e-5})"},
      {"warmup_decay_lr", "WarmupDecayLR", 1, 3, "{}"},
      {"warmup_cosine_lr", "WarmupCosineLR", 8, 40, "{}"},
      {"warmup_cosine_lr", "WarmupCosineLR", 6, 40,
       R"({"warmup_type": "linear", "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05})"},
      {"warmup_cosine_lr", "WarmupCosineLR", 0, 20, R"({"cos_min_ratio": 0.0})"},
  };
  const double lr = 3e-4;
  auto list = nlohmann::json::array();
  for (const auto& c : cases)
    list.push_back({{"kind", "schedule"}, {"type", c.type}, {"lr", lr}, {"warmup", c.warmup}, {"total", c.total},
                    {"params", nlohmann::json::parse(c.kwargs)}, {"steps", c.total + 3}});
  const auto dir = loom_test::fresh_dir("schedule/deepspeed");
  loom_test::write_bytes(dir / "cases.json", list.dump());
  const std::string printed = run_capture(std::string(py) + " " +
                                          (loom_test::source_dir() / "tests/schedule/deepspeed_peer.py").string() + " " +
                                          (dir / "cases.json").string() + " " + (dir / "out.json").string() + " 2>&1");
  INFO(printed);
  REQUIRE(std::filesystem::exists(dir / "out.json"));
  const auto want = nlohmann::json::parse(loom_test::read_bytes(dir / "out.json"));
  REQUIRE(want.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    INFO(c.type << " warmup " << c.warmup << " " << c.kwargs);
    LRScheduler<FromArgs> s(params(c.warmup, c.total, lr, nlohmann::json::parse(c.kwargs)), c.name);
    for (std::size_t step = 0; step < want[i].size(); ++step) {
      INFO("step " << step);
      CHECK(s.current_lr() == want[i][step].get<double>());  // the same arithmetic: equal, not close
      s.step();
    }
  }
  // The run's own figures, where a config gives them, must be the run's (HF's rule).
  CHECK(loom_test::error_of([&] {
          LRScheduler<FromArgs>(params(5, 40, lr, nlohmann::json::parse(R"({"total_num_steps": 30})")), "warmup_decay_lr");
        }) == "loom: warmup_decay_lr: total_num_steps 30 disagrees with the run's 40 optimizer steps; HF's DeepSpeed "
              "integration requires them equal: set it to \"auto\"");
  CHECK(loom_test::error_of([&] {
          LRScheduler<FromArgs>(params(0, 40, lr, nlohmann::json::parse(R"({"warmup_num_steps": 0})")), "warmup_lr");
        }).starts_with("loom: warmup_lr: warmup_num_steps 0 disagrees with the run's warmup of 1 steps"));
  CHECK(loom_test::error_of([&] {
          LRScheduler<FromArgs>(params(0, 40, lr, nlohmann::json::parse(R"({"warmup_type": "cosine"})")), "warmup_lr");
        }) == "loom: lr_scheduler_kwargs: warmup_type of warmup_lr must be one of log, linear, got 'cosine'");
}

TEST_CASE("reduce_lr_on_plateau equals torch's ReduceLROnPlateau under HF's get_scheduler") {
  const char* py = loom_test::python("transformers cross-check");
  if (py == nullptr) return;
  const std::vector<double> metrics{1.0, 0.9, 0.95, 0.91, 0.92, 0.93, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.91};
  const std::string kwargs = R"({"patience": 2, "factor": 0.5, "cooldown": 1, "threshold": 0.01})";
  std::string list;
  for (double m : metrics) list += (list.empty() ? "" : ",") + std::to_string(m);
  const std::string script =
      "import json, sys, torch\n"
      "from transformers import get_scheduler\n"
      "p = torch.nn.Parameter(torch.zeros(1))\n"
      "opt = torch.optim.SGD([p], lr=0.1)\n"
      "s = get_scheduler('reduce_lr_on_plateau', opt, scheduler_specific_kwargs=json.loads(sys.argv[1]))\n"
      "out = []\n"
      "for m in [" + list + "]:\n"
      "    s.step(m); out.append(opt.param_groups[0]['lr'])\n"
      "print(json.dumps(out))\n";
  const auto expected = nlohmann::json::parse(run_capture(std::string(py) + " -c \"" + script + "\" '" + kwargs + "'"));
  LRScheduler<FromArgs> s(params(0, 100, 0.1, nlohmann::json::parse(kwargs)), "reduce_lr_on_plateau");
  LRScheduler<ReduceLROnPlateau> typed(params(0, 100, 0.1, nlohmann::json::parse(kwargs)));
  CHECK(s.wants_metric());
  bool reduced = false;
  for (std::size_t i = 0; i < metrics.size(); ++i) {
    s.step_metric(metrics[i]);
    typed.step_metric(metrics[i]);
    CHECK(s.current_lr() == doctest::Approx(expected[i].get<double>()));
    CHECK(typed.current_lr() == doctest::Approx(expected[i].get<double>()));
    reduced = reduced || s.current_lr() < 0.1;
  }
  CHECK(reduced);  // the sequence does hit the plateau rule
}

TEST_CASE("schedule kwargs are checked at start-up with loom: errors") {
  CHECK_THROWS_WITH_AS(LRScheduler<FromArgs>(params(0, 10), "cosine_with_restart"),
                       doctest::Contains("loom: lr_scheduler_type 'cosine_with_restart' is not one of linear"),
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<Cosine>(params(0, 10, 1.0, {{"num_cycle", 2}})),
                       "loom: lr_scheduler_kwargs: 'num_cycle' is not an argument of cosine (it takes: num_cycles)",
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<Linear>(params(0, 10, 1.0, {{"power", 2}})),
                       "loom: lr_scheduler_kwargs: 'power' is not an argument of linear (it takes: nothing)",
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<CosineWithMinLR>(params(0, 10)),
                       doctest::Contains("loom: cosine_with_min_lr needs min_lr or min_lr_rate"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<CosineWithMinLR>(params(0, 10, 1.0, {{"min_lr", 0.1}, {"min_lr_rate", 0.1}})),
                       doctest::Contains("set only one of min_lr and min_lr_rate"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<WarmupStableDecay>(params(0, 10)),
                       doctest::Contains("loom: warmup_stable_decay needs num_decay_steps"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<WarmupStableDecay>(params(5, 10, 1.0, {{"num_decay_steps", 8}})),
                       doctest::Contains("exceed the 10 training steps"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<WarmupStableDecay>(params(0, 10, 1.0, {{"num_decay_steps", 5}, {"decay_type", "exp"}})),
                       doctest::Contains("decay_type of warmup_stable_decay must be one of linear, cosine, 1-sqrt"),
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<Polynomial>(params(0, 10, 1e-8)),
                       doctest::Contains("loom: polynomial schedule: lr_end"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<Cosine>(params(0, 10, 1.0, {{"num_cycles", "two"}})),
                       doctest::Contains("num_cycles of cosine must be a number"), loom::Error);
  // Counts far beyond int64 (found by the scheduler_kwargs fuzzer: 1e24 was cast to int64,
  // which is undefined behaviour) are refused before the cast.
  CHECK_THROWS_WITH_AS(
      LRScheduler<WarmupStableDecay>(params(0, 10, 1.0, {{"num_stable_steps", -0.0}, {"num_decay_steps", 1e24}})),
      "loom: lr_scheduler_kwargs: num_decay_steps of warmup_stable_decay must be a whole number of at least 0 (below "
      "1e15), got 1e+24",
      loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<ReduceLROnPlateau>(params(0, 10, 1.0, {{"patience", -1e300}})),
                       doctest::Contains("patience of reduce_lr_on_plateau must be a whole number of at least 0"),
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<ReduceLROnPlateau>(params(0, 10, 1.0, {{"cooldown", 1e20}})),
                       doctest::Contains("cooldown of reduce_lr_on_plateau must be a whole number"), loom::Error);
  // Every kwarg has its range (HF takes these as given; issue 27): counts are whole and not
  // negative (HF's int() would truncate 4.7), rates within [0, 1], cycles and floors not negative.
  CHECK_THROWS_WITH_AS(LRScheduler<WarmupStableDecay>(params(0, 10, 1.0, {{"num_decay_steps", 4.7}})),
                       doctest::Contains("num_decay_steps of warmup_stable_decay must be a whole number of at least 0"),
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<ReduceLROnPlateau>(params(0, 10, 1.0, {{"patience", -1}})),
                       doctest::Contains("got -1"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<CosineWithMinLR>(params(0, 10, 1.0, {{"min_lr_rate", 1.5}})),
                       "loom: lr_scheduler_kwargs: min_lr_rate of cosine_with_min_lr must be in [0, 1], got 1.5",
                       loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<CosineWithMinLR>(params(0, 10, 1.0, {{"min_lr_rate", -0.1}})),
                       doctest::Contains("must be in [0, 1], got -0.1"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<CosineWithMinLR>(params(0, 10, 1.0, {{"min_lr", -1e-5}})),
                       doctest::Contains("min_lr of cosine_with_min_lr must be in [0, 1], got -1e-05"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<Cosine>(params(0, 10, 1.0, {{"num_cycles", -0.5}})),
                       doctest::Contains("num_cycles of cosine must be in [0, inf], got -0.5"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<WarmupStableDecay>(params(0, 10, 1.0, {{"num_decay_steps", 4}, {"min_lr_ratio", -0.2}})),
                       doctest::Contains("min_lr_ratio of warmup_stable_decay must be in [0, 1]"), loom::Error);
  CHECK_THROWS_WITH_AS(LRScheduler<ReduceLROnPlateau>(params(0, 10, 1.0, {{"min_lr", -1.0}})),
                       doctest::Contains("min_lr of reduce_lr_on_plateau must be in [0, inf]"), loom::Error);
  // Values inside their ranges still work.
  CHECK(LRScheduler<WarmupStableDecay>(params(0, 10, 1.0, {{"num_decay_steps", 4}})).lr_at(6) == 1.0);
  CHECK(LRScheduler<CosineWithMinLR>(params(0, 10, 1.0, {{"min_lr_rate", 1.0}})).lr_at(5) == doctest::Approx(1.0));
}

TEST_CASE("scheduler state round-trips, plateau state included") {
  LRScheduler<Linear> s(params(0, 10));
  for (int i = 0; i < 4; ++i) s.step();
  LRScheduler<Linear> t(params(0, 10));
  t.load_state_dict(s.state_dict());
  CHECK(t.step_count() == 4);
  CHECK(t.current_lr() == doctest::Approx(0.6));

  LRScheduler<FromArgs> p(params(0, 10, 0.1, {{"patience", 0}}), "reduce_lr_on_plateau");
  p.step_metric(1.0);
  p.step_metric(2.0);  // worse: patience 0 -> reduce
  CHECK(p.current_lr() == doctest::Approx(0.01));
  LRScheduler<FromArgs> q(params(0, 10, 0.1, {{"patience", 0}}), "reduce_lr_on_plateau");
  q.load_state_dict(p.state_dict());
  CHECK(q.current_lr() == doctest::Approx(0.01));
  q.step_metric(3.0);
  p.step_metric(3.0);
  CHECK(q.current_lr() == doctest::Approx(p.current_lr()));

  // Through the file, before any metric: best is inf, which JSON writes as null.
  for (const char* mode : {"min", "max"}) {
    LRScheduler<FromArgs> fresh(params(0, 10, 0.1, {{"mode", mode}}), "reduce_lr_on_plateau");
    const auto text = fresh.state_dict().dump();
    CHECK(text.find("\"best\":null") != std::string::npos);
    LRScheduler<FromArgs> back(params(0, 10, 0.1, {{"mode", mode}}), "reduce_lr_on_plateau");
    back.load_state_dict(nlohmann::json::parse(text));
    CHECK(back.state_dict() == fresh.state_dict());
  }
}
