// loom::json: the strict reader every loom file and JSON flag goes through.
#include <loom/config/json.hpp>
#include <loom/config/validate.hpp>
#include <loom/schedule/from_args.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <string>

namespace {
using loom_test::error_of;
}  // namespace

TEST_CASE("json::parse refuses a key given twice, naming the key and the object") {
  CHECK(loom::json::parse(R"({"a": 1, "b": {"a": 2}})", "f.json")["b"]["a"] == 2);  // the same key in two objects is fine
  CHECK(error_of([] { (void)loom::json::parse(R"({"a": 1, "a": 2})", "f.json"); }) ==
        "loom: f.json: key 'a' appears twice in the top-level object");
  CHECK(error_of([] { (void)loom::json::parse(R"({"s": {"T": {"x": true, "x": false}}})", "f.json"); }) ==
        "loom: f.json: key 'x' appears twice in the object 's.T'");
  CHECK(error_of([] { (void)loom::json::parse(R"([{"k": 1}, {"k": 2, "k": 3}])", "f.json"); }) ==
        "loom: f.json: key 'k' appears twice in the top-level object");
  const auto bad = error_of([] { (void)loom::json::parse(R"({"a": )", "f.json"); });
  CHECK(bad.rfind("loom: f.json is not valid JSON: [json.exception.parse_error", 0) == 0);
  // Nesting: 1000 levels read, one more refused before the parse holds more (a nesting of
  // millions once cost gigabytes: each open object keeps its path).
  const auto nested = [](int depth, std::string_view open, std::string_view close) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += "1";
    for (int i = 0; i < depth; ++i) text += close;
    return text;
  };
  CHECK(loom::json::parse(nested(1000, "[", "]"), "f.json").is_array());
  CHECK(error_of([&] { (void)loom::json::parse(nested(1001, "[", "]"), "f.json"); }) ==
        "loom: f.json: JSON nested more than 1000 levels deep (arrays and objects); no file loom reads nests like this");
  CHECK(error_of([&] { (void)loom::json::parse(nested(5'000'000, "{\"k\": ", "}"), "f.json"); }) ==
        "loom: f.json: JSON nested more than 1000 levels deep (arrays and objects); no file loom reads nests like this");
  // The ordered variant keeps the text's order.
  const auto o = loom::json::parse_ordered(R"({"z": 1, "a": 2})", "f.json");
  CHECK(o.begin().key() == "z");
  CHECK(error_of([] { (void)loom::json::parse_ordered(R"({"z": 1, "z": 2})", "f.json"); }).find("appears twice") !=
        std::string::npos);
}

TEST_CASE("json::read_file names the file; json::Fields names the file and the field") {
  const auto dir = loom_test::fresh_dir("config_json");
  const auto missing = dir / "missing.json";
  CHECK(error_of([&] { (void)loom::json::read_file(missing); }) ==
        "loom: cannot open " + missing.string() + " (missing or unreadable)");
  const auto file = dir / "state.json";
  loom_test::write_bytes(file, R"({"n": -5, "x": 1.5, "s": "text", "b": true, "z": null, "o": {}, "l": [1]})");
  const auto j = loom::json::read_file(file);
  const loom::json::Fields f(j, file.string());
  const std::string at = "loom: " + file.string() + ": field ";
  CHECK(f.integer("n") == -5);
  CHECK(error_of([&] { (void)f.integer("n", 0); }) == at + "'n' must be an integer >= 0, got -5");
  CHECK(error_of([&] { (void)f.integer("n", 0, 9); }) == at + "'n' must be an integer in [0, 9], got -5");
  CHECK(error_of([&] { (void)f.integer("x"); }) == at + "'x' must be an integer, got 1.5");
  CHECK(error_of([&] { (void)f.integer("absent"); }) == at + "'absent' is missing");
  CHECK(error_of([&] { (void)f.integer("z"); }) == at + "'z' is null");
  CHECK_FALSE(f.optional_integer("z").has_value());
  CHECK_FALSE(f.optional_integer("absent").has_value());
  CHECK(f.number("n") == -5.0);
  CHECK(error_of([&] { (void)f.number("x", 2.0); }) == at + "'x' must be a number >= 2, got 1.5");
  CHECK(error_of([&] { (void)f.number("s"); }) == at + "'s' must be a number, got \"text\"");
  CHECK(f.string("s") == "text");
  CHECK(error_of([&] { (void)f.string("b"); }) == at + "'b' must be a string, got true");
  CHECK(f.boolean("b"));
  CHECK(error_of([&] { (void)f.boolean("n"); }) == at + "'n' must be true or false, got -5");
  CHECK(f.object("o").empty());
  CHECK(error_of([&] { (void)f.object("l"); }) == at + "'l' must be a JSON object, got [1]");
  CHECK(f.array("l").size() == 1);
  CHECK(error_of([&] { (void)loom::json::Fields(j["l"], "f.json"); }) == "loom: f.json is not a JSON object");
  // Without a file name the caller adds it (the checkpointer does).
  CHECK(error_of([&] { (void)loom::json::Fields(j, "").integer("absent"); }) == "loom: field 'absent' is missing");
}

TEST_CASE("--lr_scheduler_kwargs: a key given twice, or null for a number, is an error") {
  loom::TrainingArguments a;
  a.lr_scheduler_type = "cosine";
  a.lr_scheduler_kwargs = R"({"num_cycles": 1, "num_cycles": 2})";
  CHECK(error_of([&] { loom::validate(a); }) ==
        "loom: --lr_scheduler_kwargs: key 'num_cycles' appears twice in the top-level object");
  a.lr_scheduler_kwargs = R"({"num_cycles": null})";
  loom::validate(a);
  const auto params = loom::schedule::make_schedule_params(a, 10);
  CHECK(error_of([&] { loom::schedule::LRScheduler<loom::schedule::FromArgs>(params, "cosine"); }) ==
        "loom: lr_scheduler_kwargs: num_cycles of cosine must be a number, got null");
  // Where HF's default is None, null means the default.
  a.lr_scheduler_type = "cosine_with_min_lr";
  a.lr_scheduler_kwargs = R"({"min_lr": null, "min_lr_rate": 0.1})";
  const auto p2 = loom::schedule::make_schedule_params(a, 10);
  loom::schedule::LRScheduler<loom::schedule::FromArgs> ok(p2, "cosine_with_min_lr");
  CHECK(ok.current_lr() >= 0.0);
}
