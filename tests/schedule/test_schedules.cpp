// Learning-rate schedules against HF's formulas (transformers.optimization), evaluated by
// hand for small cases, plus the run-time selection by name.
#include <loom/schedule/from_args.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

using namespace loom::schedule;

TEST_CASE("linear schedule with warmup: HF's lr_lambda") {
  ScheduleParams p{2, 10, {}};
  LRScheduler<Linear> s(1.0, p);
  // step < 2: step / 2; then (10 - step) / 8
  const double expected[] = {0.0, 0.5, 1.0, 7.0 / 8, 6.0 / 8, 5.0 / 8, 4.0 / 8, 3.0 / 8, 2.0 / 8, 1.0 / 8, 0.0, 0.0};
  for (int step = 0; step < 12; ++step) CHECK(s.lr_at(step) == doctest::Approx(expected[step]));
  // current_lr follows step().
  CHECK(s.current_lr() == 0.0);
  s.step();
  s.step();
  s.step();
  CHECK(s.current_lr() == doctest::Approx(7.0 / 8));
  // Peak scaling.
  CHECK(LRScheduler<Linear>(3e-4, p).lr_at(4) == doctest::Approx(3e-4 * 6.0 / 8));
  // No warmup: starts at the peak.
  CHECK(LRScheduler<Linear>(1.0, ScheduleParams{0, 4, {}}).lr_at(0) == doctest::Approx(1.0));
}

TEST_CASE("constant, constant_with_warmup and cosine") {
  ScheduleParams p{4, 20, {}};
  CHECK(LRScheduler<Constant>(0.1, p).lr_at(0) == doctest::Approx(0.1));
  CHECK(LRScheduler<Constant>(0.1, p).lr_at(19) == doctest::Approx(0.1));
  CHECK(LRScheduler<ConstantWithWarmup>(1.0, p).lr_at(1) == doctest::Approx(0.25));
  CHECK(LRScheduler<ConstantWithWarmup>(1.0, p).lr_at(10) == doctest::Approx(1.0));
  LRScheduler<Cosine> c(1.0, p);
  CHECK(c.lr_at(2) == doctest::Approx(0.5));
  CHECK(c.lr_at(4) == doctest::Approx(1.0));
  CHECK(c.lr_at(12) == doctest::Approx(0.5));  // half way through the decay
  CHECK(c.lr_at(20) == doctest::Approx(0.0).epsilon(1e-12));
  const double progress = (7.0 - 4.0) / 16.0;
  CHECK(c.lr_at(7) == doctest::Approx(0.5 * (1 + std::cos(std::numbers::pi * progress))));
}

TEST_CASE("warmup resolution: integer steps, fraction below 1, warmup_ratio") {
  CHECK(resolve_warmup_steps(10, 0.0, 100) == 10);
  CHECK(resolve_warmup_steps(0.1, 0.0, 95) == 10);  // ceil(9.5)
  CHECK(resolve_warmup_steps(0, 0.25, 10) == 3);    // ceil(2.5)
  CHECK(resolve_warmup_steps(0, 0.0, 10) == 0);
}

TEST_CASE("FromArgs picks the formula by HF name and rejects unknown names") {
  ScheduleParams p{2, 10, {}};
  LRScheduler<FromArgs> lin(1.0, p, "linear");
  LRScheduler<FromArgs> cos(1.0, p, "cosine");
  for (int step = 0; step <= 10; ++step) {
    CHECK(lin.lr_at(step) == doctest::Approx(LRScheduler<Linear>(1.0, p).lr_at(step)));
    CHECK(cos.lr_at(step) == doctest::Approx(LRScheduler<Cosine>(1.0, p).lr_at(step)));
  }
  CHECK_THROWS_WITH_AS(LRScheduler<FromArgs>(1.0, p, "cosine_with_restarts"),
                       doctest::Contains("loom: lr_scheduler_type 'cosine_with_restarts' is not available"),
                       loom::Error);
}

TEST_CASE("scheduler state round-trips") {
  LRScheduler<Linear> s(1.0, ScheduleParams{0, 10, {}});
  for (int i = 0; i < 4; ++i) s.step();
  LRScheduler<Linear> t(1.0, ScheduleParams{0, 10, {}});
  t.load_state_dict(s.state_dict());
  CHECK(t.step_count() == 4);
  CHECK(t.current_lr() == doctest::Approx(0.6));
}
