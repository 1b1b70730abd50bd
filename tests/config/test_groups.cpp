// Tests for groups in config/fields.hpp: a struct whose settings live in nested structs (member
// groups) or in base classes named by loom_groups reads and writes as one flat list of settings
// through the command line, JSON and --help, with no limit on the whole (Boost.PFR's is 100
// fields a struct).
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace groups_test {

// Forty settings of four kinds, named <p>_i0..9, <p>_d0..9, <p>_b0..9, <p>_s0..9; each default
// differs, so that a value landing in the wrong field shows.
#define LOOM_TEST_FORTY(p, base)                                                                         \
  int64_t p##_i0 = base + 0, p##_i1 = base + 1, p##_i2 = base + 2, p##_i3 = base + 3, p##_i4 = base + 4; \
  int64_t p##_i5 = base + 5, p##_i6 = base + 6, p##_i7 = base + 7, p##_i8 = base + 8, p##_i9 = base + 9; \
  double p##_d0 = base + 0.5, p##_d1 = base + 1.5, p##_d2 = base + 2.5, p##_d3 = base + 3.5;             \
  double p##_d4 = base + 4.5, p##_d5 = base + 5.5, p##_d6 = base + 6.5, p##_d7 = base + 7.5;             \
  double p##_d8 = base + 8.5, p##_d9 = base + 9.5;                                                       \
  bool p##_b0 = false, p##_b1 = true, p##_b2 = false, p##_b3 = true, p##_b4 = false;                    \
  bool p##_b5 = true, p##_b6 = false, p##_b7 = true, p##_b8 = false, p##_b9 = true;                     \
  std::optional<std::string> p##_s0, p##_s1, p##_s2, p##_s3, p##_s4, p##_s5, p##_s6, p##_s7, p##_s8;   \
  std::optional<std::string> p##_s9 = #p

struct Alpha {
  LOOM_TEST_FORTY(alpha, 100);
  static constexpr loom::FieldHelp field_help[] = {{"alpha_i0", "the first of alpha"}};
};
struct Beta {
  LOOM_TEST_FORTY(beta, 200);
};
struct Gamma {
  LOOM_TEST_FORTY(gamma, 300);
  static constexpr std::string_view help_heading = "the gamma settings";
};
struct Delta {
  LOOM_TEST_FORTY(delta, 400);
};
struct Inner {
  int64_t inner_depth = 7;
};
struct Epsilon {  // a group holding a group
  std::string epsilon_name = "e";
  Inner inner;
};

// 1 + 4 x 40 + 2 = 163 settings as member groups, with a GivenFlags inside a group and one of its own.
struct Wide {
  int64_t top = 1;
  Alpha alpha;
  Beta beta;
  struct {
    loom::GivenFlags given;
  } record;
  Gamma gamma;
  Delta delta;
  Epsilon epsilon;
  static constexpr loom::FieldHelp field_help[] = {{"beta_i3", "described by the outer struct"}};
};

// The same 160 as base-class groups: code reads `wide.alpha_i0`.
struct WideBases : loom::Grouped<Alpha, Beta, Gamma, Delta> {};

// The same, the bases listed by hand.
struct ListedBases : Alpha, Beta {
  using loom_groups = loom::Groups<Alpha, Beta>;
};
// A struct of groups with a field of its own, or a base left out of its list, is refused.
struct OwnField : loom::Grouped<Alpha, Beta> {
  int64_t own = 0;
};
struct Unlisted : Alpha, Beta {
  using loom_groups = loom::Groups<Alpha>;
};
// Two groups of one struct declaring the same field: C++ allows it (`twice.seed` is then
// ambiguous), a command line cannot (check_struct refuses it, naming the flag).
struct SeedA {
  int64_t seed = 0;
};
struct SeedB {
  int64_t width = 1;
  int64_t seed = 2;
};
struct Twice : loom::Grouped<SeedA, SeedB> {};

}  // namespace groups_test

using groups_test::Wide;
using groups_test::ListedBases;
using groups_test::OwnField;
using groups_test::Unlisted;
using groups_test::WideBases;

TEST_CASE("groups: the settings of a struct of 163 are one flat list, in declaration order") {
  static_assert(loom::detail::setting_count<Wide>() == 163);
  static_assert(loom::detail::setting_count<WideBases>() == 160);
  static_assert(loom::detail::has_given_flags_v<Wide>);
  static_assert(!loom::detail::has_given_flags_v<WideBases>);
  constexpr auto names = loom::detail::setting_names<Wide>();
  CHECK(names[0] == "top");
  CHECK(names[1] == "alpha_i0");
  CHECK(names[40] == "alpha_s9");
  CHECK(names[41] == "beta_i0");
  CHECK(names[81] == "gamma_i0");
  CHECK(names[121] == "delta_i0");
  CHECK(names[161] == "epsilon_name");
  CHECK(names[162] == "inner_depth");
  static_assert(std::is_same_v<loom::detail::setting_t<Wide, 0>, int64_t>);
  static_assert(std::is_same_v<loom::detail::setting_t<Wide, 11>, double>);
  static_assert(std::is_same_v<loom::detail::setting_t<Wide, 40>, std::optional<std::string>>);
  static_assert(std::is_same_v<loom::detail::setting_t<Wide, 162>, int64_t>);
  static_assert(loom::detail::setting_names<WideBases>()[159] == "delta_s9");
  static_assert(loom::detail::setting_names<ListedBases>()[79] == "beta_s9");
  static_assert(loom::detail::groups_well_formed<WideBases>() && loom::detail::groups_well_formed<ListedBases>());
  static_assert(!loom::detail::groups_well_formed<OwnField>());
  static_assert(!loom::detail::groups_well_formed<Unlisted>());
  static_assert(loom::detail::repeated_setting<groups_test::Twice>() == 2);
  static_assert(std::is_same_v<loom::detail::spelled<loom::detail::FieldNameOf<groups_test::Twice, 2>>,
                               loom::detail::Name<'s', 'e', 'e', 'd'>>);
  static_assert(loom::detail::repeated_setting<WideBases>() == loom::detail::no_index);
  // A base-class group's help_heading is its own sub-heading, not the whole's heading.
  static_assert(loom::detail::help_heading<WideBases>() == "WideBases");
  static_assert(loom::detail::help_heading<loom::TrainingArguments>() == "TrainingArguments");

  // for_each_setting visits each once, with its setting index.
  std::size_t visited = 0;
  loom::detail::for_each_setting(Wide{}, [&](const auto&, std::size_t index) { CHECK(index == visited++); });
  CHECK(visited == 163);
}

TEST_CASE("groups: the command line reaches every group, and records the flags given") {
  const std::vector<std::string> args = {"--top",         "5",       "--alpha_i0",      "-3",   "--beta-d9=0.25",
                                         "--gamma_b0",    "--delta_s4", "text",         "--inner_depth", "9",
                                         "--epsilon_name", "x"};
  const auto parsed = loom::try_parse_args<Wide>(args);
  REQUIRE_FALSE(parsed.help);
  const Wide& w = std::get<0>(parsed.values);
  CHECK(w.top == 5);
  CHECK(w.alpha.alpha_i0 == -3);
  CHECK(w.alpha.alpha_i1 == 101);  // its neighbour untouched
  CHECK(w.beta.beta_d9 == 0.25);
  CHECK(w.gamma.gamma_b0);
  CHECK(w.delta.delta_s4 == "text");
  CHECK(w.epsilon.inner.inner_depth == 9);
  CHECK(w.epsilon.epsilon_name == "x");
  CHECK(w.record.given.names() ==
        std::vector<std::string>{"alpha_i0", "beta_d9", "delta_s4", "epsilon_name", "gamma_b0", "inner_depth", "top"});

  // Errors name the flag as for a flat struct; the nearest name comes from any group.
  CHECK_THROWS_WITH_AS(loom::try_parse_args<Wide>(std::vector<std::string>{"--gamma_i99", "1"}),
                       doctest::Contains("unknown argument --gamma_i99"), loom::Error);
  CHECK_THROWS_WITH_AS(loom::try_parse_args<Wide>(std::vector<std::string>{"--delta_i2", "x"}),
                       doctest::Contains("--delta_i2"), loom::Error);
  // A group's name is no flag.
  CHECK_THROWS_AS(loom::try_parse_args<Wide>(std::vector<std::string>{"--alpha", "1"}), loom::Error);

  // Base-class groups: the same, and the fields are plain members of the whole.
  const auto bases = loom::try_parse_args<WideBases>(std::vector<std::string>{"--alpha_i0", "8", "--delta_d0", "2"});
  CHECK(std::get<0>(bases.values).alpha_i0 == 8);
  CHECK(std::get<0>(bases.values).delta_d0 == 2.0);
  CHECK(std::get<0>(bases.values).gamma_i0 == 300);
}

TEST_CASE("groups: JSON is flat, in declaration order, and reads back") {
  Wide w;
  w.alpha.alpha_s3 = "three";
  w.delta.delta_i9 = -1;
  w.epsilon.inner.inner_depth = 11;
  const auto j = loom::to_json(w);
  REQUIRE(j.size() == 163);
  CHECK(j.begin().key() == "top");
  CHECK(std::prev(j.end()).key() == "inner_depth");
  CHECK(j.at("alpha_s3") == "three");
  CHECK(j.at("alpha_s0").is_null());
  CHECK(j.at("inner_depth") == 11);
  CHECK_FALSE(j.contains("alpha"));
  CHECK_FALSE(j.contains("given"));

  const Wide back = loom::from_json<Wide>(nlohmann::json::parse(j.dump()));
  CHECK(loom::to_json(back) == j);
  CHECK(back.record.given.empty());  // from_json reads a file loom wrote: nothing recorded

  const auto bases = loom::to_json(WideBases{});
  CHECK(bases.size() == 160);
  CHECK(loom::to_json(loom::from_json<WideBases>(nlohmann::json::parse(bases.dump()))) == bases);
  CHECK_THROWS_WITH_AS(loom::from_json<Wide>(nlohmann::json::parse(R"({"beta_i3": "x"})")),
                       "loom: JSON key 'beta_i3' expects an integer, got \"x\"", loom::Error);
}

TEST_CASE("groups: --help lists every setting under its group's sub-heading") {
  const std::string help = loom::help_text<Wide>("wide");
  CHECK(help.find("\nWide:\n  --top <int>  (default: 1)\n alpha:\n  --alpha_i0 <int>  (default: 100)\n"
                  "      the first of alpha\n") != std::string::npos);
  CHECK(help.find("\n beta:\n  --beta_i0 <int>  (default: 200)\n") != std::string::npos);
  CHECK(help.find("  --beta_i3 <int>  (default: 203)\n      described by the outer struct\n") != std::string::npos);
  CHECK(help.find("\n the gamma settings:\n  --gamma_i0 <int>") != std::string::npos);
  CHECK(help.find("\n epsilon:\n  --epsilon_name <string>  (default: e)\n inner:\n  --inner_depth <int>") !=
        std::string::npos);
  CHECK(help.find("\n  --delta_s9 <string>  (default: delta)\n") != std::string::npos);
  CHECK(help.find("--record") == std::string::npos);
  CHECK(help.find("--given") == std::string::npos);
  std::size_t flags = 0;
  for (std::size_t at = help.find("\n  --"); at != std::string::npos; at = help.find("\n  --", at + 1)) ++flags;
  CHECK(flags == 163 + 1);  // and --help

  const std::string bases = loom::help_text<WideBases>("wide");
  INFO(bases.substr(0, 300));
  CHECK(bases.find("\nWideBases:\n Alpha:\n  --alpha_i0 <int>  (default: 100)\n") != std::string::npos);
  CHECK(bases.find("\n the gamma settings:\n  --gamma_i0 <int>") != std::string::npos);
}

TEST_CASE("groups: TrainingArguments is its groups, read as one flat list of HF's names") {
  using loom::TrainingArguments;
  const auto j = loom::to_json(TrainingArguments{});
  CHECK(j.begin().key() == "output_dir");
  CHECK(j.size() == loom::detail::setting_count<TrainingArguments>());
  static_assert(loom::detail::given_flags_count<TrainingArguments>() == 1);
  // A field is a plain member of the whole, and of its group.
  TrainingArguments args;
  args.learning_rate = 0.5;
  CHECK(static_cast<const loom::training_groups::Optimizer&>(args).learning_rate == 0.5);
  const std::string help = loom::help_text<TrainingArguments>("train");
  const auto optimizer = help.find("\n optimizer:\n  --optim <string>");
  const auto schedule = help.find("\n length and schedule:\n");
  REQUIRE(optimizer != std::string::npos);
  REQUIRE(schedule != std::string::npos);
  const auto lr = help.find("\n  --learning_rate <float>");
  CHECK((optimizer < lr && lr < schedule));
}
