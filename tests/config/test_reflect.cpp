// Tests for config/reflect.hpp: command-line parsing, --help text, JSON and JSON files.
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace reflect_test {

// One field of every supported kind.
struct AllTypes {
  bool flag = false;
  int32_t small = 1;
  int64_t big = 2;
  uint32_t count = 3;
  float ratio = 0.5f;
  double rate = 0.25;
  std::string name = "x";
  std::optional<int64_t> opt_int;
  std::optional<double> opt_double = 1.5;
  std::optional<std::string> opt_string;
  std::optional<bool> opt_bool;
};

// A user struct parsed together with TrainingArguments, as HfArgumentParser((ModelArgs, TrainingArguments)).
struct ModelArgs {
  std::string model_name = "gpt2";
  int64_t hidden_size = 64;
  bool tie_weights = true;
};

// Shares the field name `seed` with TrainingArguments.
struct Clashing {
  int64_t seed = 0;
};

// Descriptions and a heading as static members (config/field_help.hpp, way 1); `vocab` has none.
struct DescribedArgs {
  std::string tokenizer = "bpe";
  int64_t vocab = 100;
  std::optional<double> dropout;
  static constexpr loom::FieldHelp field_help[] = {
      {"dropout", "dropout probability (none: the model's own)"},
      {"tokenizer", "which tokenizer to load"},
  };
  static constexpr std::string_view help_heading = "model arguments";
};

// Descriptions through a function found by ADL (way 2); the heading is the struct's name.
struct DataArgs {
  std::string data_dir = "data";
  bool streaming = false;
};
inline constexpr loom::FieldHelp data_args_help[] = {{"data_dir", "folder of the training files"},
                                                      {"streaming", "read the files lazily"}};
constexpr std::span<const loom::FieldHelp> field_help(loom::HelpFor<DataArgs>) { return data_args_help; }

template <class T>
struct Wrapped {
  T inner{};
};

std::vector<std::string> argv_of(std::initializer_list<const char*> tokens) {
  return std::vector<std::string>(tokens.begin(), tokens.end());
}

template <class... Ts>
loom::ParseResult<Ts...> parse(std::initializer_list<const char*> tokens) {
  const std::vector<std::string> args = argv_of(tokens);
  return loom::try_parse_args<Ts...>(args);
}

template <class T>
T parse_one(std::initializer_list<const char*> tokens) {
  auto result = parse<T>(tokens);
  REQUIRE_FALSE(result.help);
  return std::get<0>(result.values);
}

// A fresh folder under the system temp directory, removed when the test ends.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = std::filesystem::temp_directory_path() / ("loom_test_reflect_" + std::to_string(stamp));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace reflect_test

using reflect_test::AllTypes;
using reflect_test::DataArgs;
using reflect_test::DescribedArgs;
using reflect_test::ModelArgs;
using reflect_test::parse;
using reflect_test::parse_one;

// ---- command line: values -------------------------------------------------------------------

TEST_CASE("parse_args: every field type is parsed from the command line") {
  const auto a = parse_one<AllTypes>({"--flag", "true", "--small", "-7", "--big", "9000000000", "--count", "42",
                                      "--ratio", "0.125", "--rate", "1e-3", "--name", "hello world",
                                      "--opt_int", "5", "--opt_double", "5e-5", "--opt_string", "abc",
                                      "--opt_bool", "false"});
  CHECK(a.flag == true);
  CHECK(a.small == -7);
  CHECK(a.big == 9000000000LL);
  CHECK(a.count == 42u);
  CHECK(a.ratio == 0.125f);
  CHECK(a.rate == 1e-3);
  CHECK(a.name == "hello world");
  CHECK(a.opt_int == std::optional<int64_t>(5));
  CHECK(a.opt_double == std::optional<double>(5e-5));
  CHECK(a.opt_string == std::optional<std::string>("abc"));
  CHECK(a.opt_bool == std::optional<bool>(false));
}

TEST_CASE("parse_args: no flags leaves the defaults") {
  const auto a = parse_one<AllTypes>({});
  CHECK(a.small == 1);
  CHECK(a.name == "x");
  CHECK(a.opt_double == std::optional<double>(1.5));
  CHECK_FALSE(a.opt_int.has_value());
}

TEST_CASE("parse_args: TrainingArguments fields of each kind") {
  const auto t = parse_one<loom::TrainingArguments>(
      {"--learning_rate", "3e-4", "--per_device_train_batch_size", "16", "--output_dir", "out", "--bf16",
       "--eval_steps", "50", "--run_name", "exp1", "--max_steps=100"});
  CHECK(t.learning_rate == 3e-4);
  CHECK(t.per_device_train_batch_size == 16);
  CHECK(t.output_dir == "out");
  CHECK(t.bf16);
  CHECK(t.eval_steps == std::optional<double>(50));
  CHECK(t.run_name == std::optional<std::string>("exp1"));
  CHECK(t.max_steps == 100);
  CHECK(t.per_device_eval_batch_size == 8);  // untouched default
}

TEST_CASE("parse_args: --name=value") {
  const auto a = parse_one<AllTypes>({"--small=12", "--rate=2.5", "--name=a=b", "--flag=0", "--opt_int=none"});
  CHECK(a.small == 12);
  CHECK(a.rate == 2.5);
  CHECK(a.name == "a=b");  // only the first '=' splits
  CHECK(a.flag == false);
  CHECK_FALSE(a.opt_int.has_value());

  const auto empty = parse_one<AllTypes>({"--name="});
  CHECK(empty.name.empty());
}

TEST_CASE("parse_args: dashes in a flag name read as underscores") {
  const auto t = parse_one<loom::TrainingArguments>({"--learning-rate", "0.5", "--per-device-train-batch-size=4"});
  CHECK(t.learning_rate == 0.5);
  CHECK(t.per_device_train_batch_size == 4);
}

TEST_CASE("parse_args: bare bool flags") {
  CHECK(parse_one<AllTypes>({"--flag"}).flag == true);

  SUBCASE("a bare bool followed by another flag is true") {
    const auto a = parse_one<AllTypes>({"--flag", "--small", "5"});
    CHECK(a.flag == true);
    CHECK(a.small == 5);
  }
  SUBCASE("explicit values") {
    CHECK(parse_one<AllTypes>({"--flag", "false"}).flag == false);
    CHECK(parse_one<AllTypes>({"--flag", "False"}).flag == false);
    CHECK(parse_one<AllTypes>({"--flag", "0"}).flag == false);
    CHECK(parse_one<AllTypes>({"--flag", "1"}).flag == true);
    CHECK(parse_one<AllTypes>({"--flag", "True"}).flag == true);
    CHECK(parse_one<AllTypes>({"--flag=true"}).flag == true);
  }
  SUBCASE("a bool that defaults to true can be switched off") {
    const auto t = parse_one<loom::TrainingArguments>({"--logging_nan_inf_filter", "false", "--fp16"});
    CHECK(t.logging_nan_inf_filter == false);
    CHECK(t.fp16 == true);
  }
  SUBCASE("optional<bool> bare") {
    CHECK(parse_one<AllTypes>({"--opt_bool"}).opt_bool == std::optional<bool>(true));
  }
}

TEST_CASE("parse_args: optional fields are set by a value and reset by none") {
  const auto set = parse_one<AllTypes>({"--opt_string", "s", "--opt_int", "-3"});
  CHECK(set.opt_string == std::optional<std::string>("s"));
  CHECK(set.opt_int == std::optional<int64_t>(-3));

  const auto reset = parse_one<AllTypes>({"--opt_double", "none", "--opt_string", "None", "--opt_bool", "none"});
  CHECK_FALSE(reset.opt_double.has_value());  // default 1.5 reset
  CHECK_FALSE(reset.opt_string.has_value());
  CHECK_FALSE(reset.opt_bool.has_value());
}

TEST_CASE("parse_args: floating point spellings") {
  CHECK(parse_one<AllTypes>({"--rate", "5e-5"}).rate == 5e-5);
  CHECK(parse_one<AllTypes>({"--rate", ".5"}).rate == 0.5);
  CHECK(parse_one<AllTypes>({"--rate", "-2"}).rate == -2.0);
  CHECK(parse_one<AllTypes>({"--rate", "+3"}).rate == 3.0);
  CHECK(parse_one<AllTypes>({"--rate", "1E3"}).rate == 1000.0);
}

// ---- command line: help ---------------------------------------------------------------------

TEST_CASE("parse_args: --help and -h are reported, wherever they are") {
  CHECK(parse<AllTypes>({"--help"}).help);
  CHECK(parse<AllTypes>({"-h"}).help);
  CHECK(parse<AllTypes>({"--small", "4", "--help"}).help);
  // Help wins over mistakes elsewhere on the line.
  const auto r = parse<AllTypes>({"--no_such_flag", "-h"});
  CHECK(r.help);
  CHECK(std::get<0>(r.values).small == 1);
  CHECK_FALSE(parse<AllTypes>({"--small", "4"}).help);
}

TEST_CASE("help_text: usage line and every TrainingArguments field with its default") {
  const std::string help = loom::help_text<loom::TrainingArguments>("train");
  CHECK(help.starts_with("usage: train "));
  CHECK(help.find("--help") != std::string::npos);

  // A few exact lines.
  CHECK(help.find("\n  --learning_rate <float>  (default: 5e-05)\n") != std::string::npos);
  CHECK(help.find("\n  --output_dir <string>  (default: trainer_output)\n") != std::string::npos);
  CHECK(help.find("\n  --per_device_train_batch_size <int>  (default: 8)\n") != std::string::npos);
  CHECK(help.find("\n  --fp16 <bool>  (default: false)\n") != std::string::npos);
  CHECK(help.find("\n  --logging_nan_inf_filter <bool>  (default: true)\n") != std::string::npos);
  CHECK(help.find("\n  --eval_steps <float>  (default: none)\n") != std::string::npos);
  CHECK(help.find("\n  --save_total_limit <int>  (default: none)\n") != std::string::npos);
  CHECK(help.find("\n  --num_train_epochs <float>  (default: 3)\n") != std::string::npos);
  CHECK(help.find("\n  --adam_epsilon <float>  (default: 1e-08)\n") != std::string::npos);
  CHECK(help.find("\n  --lr_scheduler_kwargs <string>  (default: {})\n") != std::string::npos);

  // Every field, with the default the struct really has.
  constexpr auto names = loom::detail::setting_names<loom::TrainingArguments>();
  std::size_t listed = 0;
  loom::detail::for_each_setting(loom::TrainingArguments{}, [&](const auto& field, std::size_t i) {
    const std::string line_start = "\n  --" + std::string(names[i]) + " <";
    const auto at = help.find(line_start);
    INFO("field " << names[i]);
    REQUIRE(at != std::string::npos);
    const auto end = help.find('\n', at + 1);
    const std::string line = help.substr(at + 1, end - at - 1);
    CHECK(line.ends_with("  (default: " + loom::detail::field_to_text(field) + ")"));
    ++listed;
  });
  CHECK(listed == names.size());
  CHECK(listed > 50);
}

TEST_CASE("help_text: several structs list all their fields") {
  const std::string help = loom::help_text<ModelArgs, loom::TrainingArguments>("run");
  CHECK(help.find("\n  --model_name <string>  (default: gpt2)\n") != std::string::npos);
  CHECK(help.find("\n  --tie_weights <bool>  (default: true)\n") != std::string::npos);
  CHECK(help.find("\n  --seed <int>  (default: 42)\n") != std::string::npos);
}

TEST_CASE("help_text: each struct under its heading, descriptions under their flags") {
  const std::string help = loom::help_text<loom::TrainingArguments, DescribedArgs, DataArgs, ModelArgs>("run");
  CHECK(help.starts_with("usage: run [--help] [settings.json] [--name value ...]\n"));

  // Headings in the order of the structs, each followed by its own fields only.
  const auto training = help.find("\nTrainingArguments:\n output:\n  --output_dir <string>");
  const auto described = help.find("\nmodel arguments:\n  --tokenizer <string>  (default: bpe)\n");
  const auto data = help.find("\nDataArgs:\n  --data_dir <string>  (default: data)\n");
  const auto model = help.find("\nModelArgs:\n  --model_name <string>  (default: gpt2)\n");
  REQUIRE(training != std::string::npos);
  REQUIRE(described != std::string::npos);
  REQUIRE(data != std::string::npos);
  REQUIRE(model != std::string::npos);
  CHECK(training < described);
  CHECK(described < data);
  CHECK(data < model);
  const auto seed = help.find("\n  --seed <int>");
  CHECK((training < seed && seed < described));
  const auto streaming = help.find("\n  --streaming <bool>");
  CHECK((data < streaming && streaming < model));

  // Member table, in any order; a field without an entry gets no description line.
  CHECK(help.find("  --tokenizer <string>  (default: bpe)\n      which tokenizer to load\n") != std::string::npos);
  CHECK(help.find("  --vocab <int>  (default: 100)\n  --dropout <float>  (default: none)\n"
                  "      dropout probability (none: the model's own)\n") != std::string::npos);
  // ADL table.
  CHECK(help.find("  --data_dir <string>  (default: data)\n      folder of the training files\n"
                  "  --streaming <bool>  (default: false)\n      read the files lazily\n") != std::string::npos);
  // No table at all.
  CHECK(help.find("  --model_name <string>  (default: gpt2)\n  --hidden_size <int>") != std::string::npos);
  // TrainingArguments' own.
  CHECK(help.find("\n  --learning_rate <float>  (default: 5e-05)\n      peak learning rate\n") != std::string::npos);
  CHECK(help.find("\n  --sharding <string>  (default: auto)\n      auto | no | ddp | zero1 | zero2 | full_shard (auto: ddp "
                  "when started as several processes, else no)\n") !=
        std::string::npos);
}

TEST_CASE("help headings: help_heading, else the struct's name without namespaces") {
  static_assert(loom::detail::help_heading<loom::TrainingArguments>() == "TrainingArguments");
  static_assert(loom::detail::help_heading<ModelArgs>() == "ModelArgs");
  static_assert(loom::detail::help_heading<DescribedArgs>() == "model arguments");
  static_assert(loom::detail::help_heading<reflect_test::Wrapped<reflect_test::DataArgs>>() ==
                "Wrapped<reflect_test::DataArgs>");
  struct Local {
    int x = 0;
  };
  CHECK(loom::detail::help_heading<Local>().ends_with("Local"));
}

TEST_CASE("TrainingArguments: every field has a description, the same as its ///< comment") {
  // The header is the one place a reader looks; --help must say the same.
  std::ifstream in(loom_test::source_dir() / "include/loom/config/training_arguments.hpp");
  REQUIRE(in);
  std::map<std::string, std::string> comments;
  const std::regex field_line(R"(^\s*[\w:<>]+\s+(\w+)(\s*=[^;]*)?;\s*///<\s*(.*\S)\s*$)");
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, field_line)) comments[m[1]] = m[3];
  }
  constexpr auto names = loom::detail::setting_names<loom::TrainingArguments>();
  constexpr auto descriptions = loom::detail::field_descriptions<loom::TrainingArguments>();
  CHECK(comments.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO("field " << names[i]);
    CHECK_FALSE(descriptions[i].empty());
    CHECK(comments[std::string(names[i])] == descriptions[i]);
  }
  CHECK(loom::field_help(loom::HelpFor<loom::TrainingArguments>{}).size() == names.size());
}

// ---- command line: errors -------------------------------------------------------------------

TEST_CASE("parse_args errors: unknown flag") {
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--learning_rat", "1"}),
                       "loom: unknown argument --learning_rat; did you mean --learning_rate?", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--per_device_batch_size=4"}),
                       "loom: unknown argument --per_device_batch_size; did you mean --per_device_eval_batch_size?",
                       loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--banana", "1"}),
                       "loom: unknown argument --banana; see --help", loom::Error);
  // transformers' flags that loom does not take say why, rather than a near name.
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--torch_compile", "true"}),
                       "loom: --torch_compile is a transformers.TrainingArguments flag that loom does not take: it "
                       "compiles a Python model with TorchDynamo, which libtorch does not have; loom::models choose "
                       "fused kernels on CUDA themselves (models::Kernels)",
                       loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--push-to-hub", "true"}),
                       "loom: --push_to_hub is a transformers.TrainingArguments flag that loom does not take: loom does "
                       "not upload to the Hugging Face Hub; the folders save_model and the checkpoints write open in "
                       "transformers, and `hf upload` uploads them",
                       loom::Error);
  for (const char* flag : {"--use_liger_kernel", "--remove_unused_columns", "--ddp_backend", "--debug", "--project"})
    CHECK(loom_test::error_of([&] { parse<loom::TrainingArguments>({flag, "x"}); })
              .find(" is a transformers.TrainingArguments flag that loom does not take: ") != std::string::npos);
}

TEST_CASE("parse_args errors: missing value names the expected kind") {
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--learning_rate"}),
                       "loom: --learning_rate needs a value (a number)", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--max_steps", "--fp16"}),
                       "loom: --max_steps needs a value (an integer)", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--output_dir"}),
                       "loom: --output_dir needs a value (a string)", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--eval_steps"}),
                       "loom: --eval_steps needs a value (a number or none)", loom::Error);
  CHECK_THROWS_WITH_AS(parse<AllTypes>({"--count"}), "loom: --count needs a value (a non-negative integer)",
                       loom::Error);
}

TEST_CASE("parse_args errors: bad integer values") {
  for (const char* bad : {"3.5", "abc", "", "1e3", " 3", "3 ", "99999999999999999999", "0x10", "--"}) {
    INFO("value '" << bad << "'");
    const std::vector<std::string> args = {std::string("--per_device_train_batch_size=") + bad};
    CHECK_THROWS_WITH_AS(loom::try_parse_args<loom::TrainingArguments>(args),
                         ("loom: --per_device_train_batch_size expects an integer, got '" + std::string(bad) + "'")
                             .c_str(),
                         loom::Error);
  }
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--per_device_train_batch_size", "3.5"}),
                       "loom: --per_device_train_batch_size expects an integer, got '3.5'", loom::Error);
  // int32 overflow, and a negative value for an unsigned field.
  CHECK_THROWS_WITH_AS(parse<AllTypes>({"--small", "3000000000"}), "loom: --small expects an integer, got '3000000000'",
                       loom::Error);
  CHECK_THROWS_WITH_AS(parse<AllTypes>({"--count", "-1"}), "loom: --count expects a non-negative integer, got '-1'",
                       loom::Error);
  CHECK_THROWS_WITH_AS(parse<AllTypes>({"--opt_int", "x"}), "loom: --opt_int expects an integer or none, got 'x'",
                       loom::Error);
}

TEST_CASE("parse_args errors: bad floating values") {
  for (const char* bad : {"abc", "1.5x", "nan", "NaN", "inf", "-inf", "1e999", "", "1,5"}) {
    INFO("value '" << bad << "'");
    const std::vector<std::string> args = {std::string("--learning_rate=") + bad};
    CHECK_THROWS_WITH_AS(loom::try_parse_args<loom::TrainingArguments>(args),
                         ("loom: --learning_rate expects a number, got '" + std::string(bad) + "'").c_str(),
                         loom::Error);
  }
}

TEST_CASE("parse_args errors: bad bool value") {
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--fp16", "maybe"}),
                       "loom: --fp16 expects true/false, got 'maybe'", loom::Error);
  CHECK_THROWS_WITH_AS(parse<AllTypes>({"--opt_bool=2"}), "loom: --opt_bool expects true/false or none, got '2'",
                       loom::Error);
}

TEST_CASE("parse_args errors: positional arguments") {
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"foo"}),
                       "loom: unexpected argument 'foo'; flags look like --name value", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--max_steps", "5", "7"}),
                       "loom: unexpected argument '7'; flags look like --name value", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"-x"}),
                       "loom: unexpected argument '-x'; flags look like --name value", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--"}),
                       "loom: unexpected argument '--'; flags look like --name value", loom::Error);
}

TEST_CASE("parse_args errors: a flag given twice") {
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--seed", "1", "--seed", "2"}),
                       "loom: --seed given twice", loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--fp16", "--fp16=false"}), "loom: --fp16 given twice",
                       loom::Error);
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--max-steps", "1", "--max_steps", "2"}),
                       "loom: --max_steps given twice", loom::Error);
}

// ---- several structs --------------------------------------------------------------------

TEST_CASE("parse_args: two structs parsed together") {
  const auto r = parse<ModelArgs, loom::TrainingArguments>(
      {"--model_name", "llama", "--learning_rate", "1e-4", "--tie_weights", "false", "--hidden_size=128"});
  REQUIRE_FALSE(r.help);
  const auto& [model, training] = r.values;
  CHECK(model.model_name == "llama");
  CHECK(model.hidden_size == 128);
  CHECK(model.tie_weights == false);
  CHECK(training.learning_rate == 1e-4);
  CHECK(training.output_dir == "trainer_output");

  // Suggestions search the fields of every struct.
  CHECK_THROWS_WITH_AS((parse<ModelArgs, loom::TrainingArguments>({"--model_nam", "x"})),
                       "loom: unknown argument --model_nam; did you mean --model_name?", loom::Error);
  CHECK_THROWS_WITH_AS((parse<ModelArgs, loom::TrainingArguments>({"--hiden_size", "3"})),
                       "loom: unknown argument --hiden_size; did you mean --hidden_size?", loom::Error);
}

TEST_CASE("parse_args: a field name shared by two structs is rejected at compile time") {
  static_assert(loom::detail::field_names_unique<ModelArgs, loom::TrainingArguments>());
  static_assert(!loom::detail::field_names_unique<reflect_test::Clashing, loom::TrainingArguments>());
  CHECK(loom::detail::field_names_unique<ModelArgs, AllTypes>());
  // The clash found names the field and both structs (tests/compile_fail/args_flag_twice.cpp
  // shows the message): `seed` is field 0 of Clashing (type 1) and a field of TrainingArguments (type 2).
  constexpr auto clash = loom::detail::find_name_clash<ModelArgs, reflect_test::Clashing, loom::TrainingArguments>();
  static_assert(clash.found && clash.first_type == 1 && clash.first_field == 0 && clash.second_type == 2);
  static_assert(!loom::detail::find_name_clash<ModelArgs, DataArgs, DescribedArgs, loom::TrainingArguments>().found);
  // The name as the compiler shows it.
  static_assert(std::is_same_v<loom::detail::spelled<loom::detail::FieldNameOf<reflect_test::Clashing, 0>>,
                               loom::detail::Name<'s', 'e', 'e', 'd'>>);
}

TEST_CASE("parse_args: four structs at once, each flag to its own struct") {
  const auto r = parse<loom::TrainingArguments, ModelArgs, DescribedArgs, DataArgs>(
      {"--seed", "3", "--hidden_size", "7", "--dropout", "0.1", "--streaming", "--data_dir=/d"});
  REQUIRE_FALSE(r.help);
  const auto& [training, model, described, data] = r.values;
  CHECK(training.seed == 3);
  CHECK(model.hidden_size == 7);
  CHECK(described.dropout == std::optional<double>(0.1));
  CHECK(described.tokenizer == "bpe");
  CHECK(data.streaming);
  CHECK(data.data_dir == "/d");
}

TEST_CASE("parse_args(argc, argv): one type gives T, several give a tuple") {
  const char* argv[] = {"/usr/bin/train", "--learning_rate", "0.1", "--model_name", "m"};
  const auto both = loom::parse_args<ModelArgs, loom::TrainingArguments>(5, argv);
  static_assert(std::is_same_v<std::remove_cv_t<decltype(both)>, std::tuple<ModelArgs, loom::TrainingArguments>>);
  CHECK(std::get<0>(both).model_name == "m");
  CHECK(std::get<1>(both).learning_rate == 0.1);

  const char* argv_one[] = {"train", "--seed", "7"};
  const auto one = loom::parse_args<loom::TrainingArguments>(3, argv_one);
  static_assert(std::is_same_v<std::remove_cv_t<decltype(one)>, loom::TrainingArguments>);
  CHECK(one.seed == 7);
}

// ---- JSON ---------------------------------------------------------------------------------

namespace {
loom::TrainingArguments modified_arguments() {
  loom::TrainingArguments t;
  t.output_dir = "runs/exp";
  t.do_train = true;
  t.per_device_train_batch_size = 32;
  t.eval_accumulation_steps = 4;
  t.learning_rate = 3.14159e-4;
  t.adam_beta2 = 0.95;
  t.max_steps = 1234;
  t.lr_scheduler_kwargs = R"({"num_cycles": 2})";
  t.logging_dir = "tb";
  t.eval_steps = 0.25;
  t.save_total_limit = 3;
  t.greater_is_better = false;
  t.metric_for_best_model = "accuracy";
  t.logging_nan_inf_filter = false;
  t.data_seed = 99;
  t.bf16 = true;
  t.sharding = "zero2";
  t.ddp_bucket_cap_mb = 50;
  return t;
}
}  // namespace

TEST_CASE("to_json: fields in declaration order, nullopt as null") {
  const auto j = loom::to_json(loom::TrainingArguments{});
  constexpr auto names = loom::detail::setting_names<loom::TrainingArguments>();
  REQUIRE(j.size() == names.size());
  std::size_t i = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++i) CHECK(it.key() == names[i]);
  CHECK(j.begin().key() == "output_dir");
  CHECK(j["eval_steps"].is_null());
  CHECK(j["learning_rate"].get<double>() == 5e-5);
  CHECK(j["per_device_train_batch_size"].is_number_integer());
  CHECK(j["fp16"].is_boolean());
  CHECK(j["optim"] == "adamw_torch_fused");

  const auto all = loom::to_json(AllTypes{});
  CHECK(all["count"].is_number_unsigned());
  CHECK(all["opt_double"].get<double>() == 1.5);
}

TEST_CASE("JSON round trip of a modified TrainingArguments") {
  const loom::TrainingArguments original = modified_arguments();
  const std::string text = loom::to_json(original).dump(2);
  const auto back = loom::from_json<loom::TrainingArguments>(nlohmann::json::parse(text));
  CHECK(loom::to_json(back) == loom::to_json(original));
  CHECK(back.learning_rate == original.learning_rate);
  CHECK(back.eval_steps == std::optional<double>(0.25));
  CHECK(back.save_total_limit == std::optional<int64_t>(3));
  CHECK(back.greater_is_better == std::optional<bool>(false));
  CHECK(back.lr_scheduler_kwargs == R"({"num_cycles": 2})");
  CHECK_FALSE(back.run_name.has_value());
  // An ordered_json is accepted as well.
  CHECK(loom::to_json(loom::from_json<loom::TrainingArguments>(loom::to_json(original))) == loom::to_json(original));
}

TEST_CASE("from_json: missing keys keep defaults; integers fit floating fields; null resets optionals") {
  const auto t = loom::from_json<loom::TrainingArguments>(
      nlohmann::json::parse(R"({"num_train_epochs": 2, "seed": 1, "eval_steps": null})"));
  CHECK(t.num_train_epochs == 2.0);
  CHECK(t.seed == 1);
  CHECK_FALSE(t.eval_steps.has_value());
  CHECK(t.output_dir == "trainer_output");

  const auto a = loom::from_json<AllTypes>(nlohmann::json::parse(R"({"opt_double": null})"));
  CHECK_FALSE(a.opt_double.has_value());
}

TEST_CASE("from_json errors") {
  using TA = loom::TrainingArguments;
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"learning_rat": 1})")),
                       "loom: unknown JSON key 'learning_rat'; did you mean 'learning_rate'?", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"zzz": 1})")), "loom: unknown JSON key 'zzz'",
                       loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"ddp_backend": "nccl"})")),
                       "loom: JSON key 'ddp_backend' is a transformers.TrainingArguments field that loom does not take: "
                       "loom chooses the process group itself: NCCL for CUDA devices, Gloo for the CPU (given "
                       "\"nccl\"; read only as null, HF's default)",
                       loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"learning_rate": "fast"})")),
                       "loom: JSON key 'learning_rate' expects a number, got \"fast\"", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"per_device_train_batch_size": 3.5})")),
                       "loom: JSON key 'per_device_train_batch_size' expects an integer, got 3.5", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"fp16": 1})")),
                       "loom: JSON key 'fp16' expects true/false, got 1", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"output_dir": ["a"]})")),
                       "loom: JSON key 'output_dir' expects a string, got an array", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"save_total_limit": "3"})")),
                       "loom: JSON key 'save_total_limit' expects an integer or none, got \"3\"", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse(R"({"learning_rate": null})")),
                       "loom: JSON key 'learning_rate' is null, but the field is not optional (expects a number)",
                       loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<AllTypes>(nlohmann::json::parse(R"({"small": 3000000000})")),
                       "loom: JSON key 'small' expects an integer, got 3000000000 (out of range)", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<AllTypes>(nlohmann::json::parse(R"({"count": -1})")),
                       "loom: JSON key 'count' expects a non-negative integer, got -1 (out of range)", loom::Error);
  CHECK_THROWS_WITH_AS(loom::from_json<TA>(nlohmann::json::parse("[1, 2]")),
                       "loom: expected a JSON object of settings, got an array", loom::Error);
}

// ---- JSON files ---------------------------------------------------------------------------

TEST_CASE("save_json / load_json round trip through a real file") {
  reflect_test::TempDir dir;
  const auto path = dir.path / "nested" / "training_args.json";
  const loom::TrainingArguments original = modified_arguments();
  loom::save_json(original, path);

  REQUIRE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.starts_with("{\n  \"output_dir\": \"runs/exp\",\n"));  // pretty, indent 2, declaration order

  const auto back = loom::load_json<loom::TrainingArguments>(path);
  CHECK(loom::to_json(back) == loom::to_json(original));
  CHECK(back.per_device_train_batch_size == 32);
  CHECK(back.data_seed == std::optional<int64_t>(99));

  // Saving again replaces the file.
  loom::TrainingArguments changed = original;
  changed.seed = 5;
  loom::save_json(changed, path);
  CHECK(loom::load_json<loom::TrainingArguments>(path).seed == 5);
}

TEST_CASE("load_json errors name the path") {
  reflect_test::TempDir dir;
  const auto missing = dir.path / "missing.json";
  CHECK_THROWS_WITH_AS(loom::load_json<loom::TrainingArguments>(missing),
                       ("loom: cannot open " + missing.string() + " (missing or unreadable)").c_str(), loom::Error);

  const auto truncated = dir.path / "truncated.json";
  {
    std::ofstream out(truncated);
    out << "{\n  \"output_dir\": \"x\",\n  \"seed\": ";
  }
  try {
    (void)loom::load_json<loom::TrainingArguments>(truncated);
    FAIL("no error for a truncated file");
  } catch (const loom::Error& e) {
    const std::string what = e.what();
    CHECK(what.starts_with("loom: " + truncated.string() + " is not valid JSON: "));
    CHECK(what.find('\n') == std::string::npos);
  }

  const auto unknown = dir.path / "unknown.json";
  {
    std::ofstream out(unknown);
    out << R"({"sead": 3})";
  }
  CHECK_THROWS_WITH_AS(loom::load_json<loom::TrainingArguments>(unknown),
                       ("loom: " + unknown.string() + ": unknown JSON key 'sead'; did you mean 'seed'?").c_str(),
                       loom::Error);
}

// ---- JSON settings for several structs: parse_json_file and `program args.json` --------

namespace {
std::filesystem::path write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return path;
}
}  // namespace

TEST_CASE("parse_json_file: one object of settings for several structs") {
  reflect_test::TempDir dir;
  const auto path = write_text(dir.path / "args.json",
                               R"({"learning_rate": 0.001, "model_name": "llama", "streaming": true,
                                   "eval_steps": null, "hidden_size": 256})");
  const auto [training, model, data] = loom::parse_json_file<loom::TrainingArguments, ModelArgs, DataArgs>(path);
  CHECK(training.learning_rate == 0.001);
  CHECK_FALSE(training.eval_steps.has_value());
  CHECK(training.seed == 42);  // not in the file: the default
  CHECK(model.model_name == "llama");
  CHECK(model.hidden_size == 256);
  CHECK(data.streaming);
  CHECK(data.data_dir == "data");

  // One type gives the struct itself, as parse_args does.
  const auto one = loom::parse_json_file<DataArgs>(write_text(dir.path / "data.json", R"({"data_dir": "x"})"));
  static_assert(std::is_same_v<std::remove_cv_t<decltype(one)>, DataArgs>);
  CHECK(one.data_dir == "x");
}

TEST_CASE("parse_json_file errors name the file, with the nearest key of any struct") {
  reflect_test::TempDir dir;
  using TA = loom::TrainingArguments;
  const auto typo = write_text(dir.path / "typo.json", R"({"learning_rate": 0.1, "hiden_size": 3})");
  CHECK_THROWS_WITH_AS((loom::parse_json_file<TA, ModelArgs>(typo)),
                       ("loom: " + typo.string() + ": unknown JSON key 'hiden_size'; did you mean 'hidden_size'?").c_str(),
                       loom::Error);
  // The key exists, but not in the structs parsed.
  const auto other = write_text(dir.path / "other.json", R"({"hidden_size": 3, "learning_rate": 0.1})");
  CHECK_THROWS_WITH_AS((loom::parse_json_file<ModelArgs>(other)),
                       ("loom: " + other.string() + ": unknown JSON key 'learning_rate'").c_str(), loom::Error);
  const auto wrong = write_text(dir.path / "wrong.json", R"({"tie_weights": "yes"})");
  CHECK_THROWS_WITH_AS((loom::parse_json_file<TA, ModelArgs>(wrong)),
                       ("loom: " + wrong.string() + ": JSON key 'tie_weights' expects true/false, got \"yes\"").c_str(),
                       loom::Error);
  const auto twice = write_text(dir.path / "twice.json", R"({"seed": 1, "seed": 2})");
  try {
    (void)loom::parse_json_file<TA, ModelArgs>(twice);
    FAIL("no error for a key given twice");
  } catch (const loom::Error& e) {
    CHECK(std::string(e.what()).starts_with("loom: " + twice.string() + ": key 'seed' appears twice"));
  }
  const auto list = write_text(dir.path / "list.json", "[1]");
  CHECK_THROWS_WITH_AS((loom::parse_json_file<TA, ModelArgs>(list)),
                       ("loom: " + list.string() + ": expected a JSON object of settings, got an array").c_str(),
                       loom::Error);
  const auto missing = dir.path / "missing.json";
  CHECK_THROWS_WITH_AS((loom::parse_json_file<TA, ModelArgs>(missing)),
                       ("loom: cannot open " + missing.string() + " (missing or unreadable)").c_str(), loom::Error);
}

TEST_CASE("parse_args: a first argument ending in .json is read before the flags") {
  reflect_test::TempDir dir;
  const std::string path =
      write_text(dir.path / "args.json", R"({"learning_rate": 0.5, "seed": 9, "model_name": "from_file"})").string();

  SUBCASE("the file alone (HF's `python train.py args.json`)") {
    const std::vector<std::string> args = {path};
    const auto r = loom::try_parse_args<loom::TrainingArguments, ModelArgs>(args);
    const auto& [training, model] = r.values;
    CHECK(training.learning_rate == 0.5);
    CHECK(training.seed == 9);
    CHECK(model.model_name == "from_file");
    CHECK(model.hidden_size == 64);
  }
  SUBCASE("flags after the file override it") {
    const std::vector<std::string> args = {path, "--seed", "1", "--hidden_size=8"};
    const auto r = loom::try_parse_args<loom::TrainingArguments, ModelArgs>(args);
    const auto& [training, model] = r.values;
    CHECK(training.learning_rate == 0.5);
    CHECK(training.seed == 1);
    CHECK(model.model_name == "from_file");
    CHECK(model.hidden_size == 8);
  }
  SUBCASE("over given defaults, through argc/argv") {
    loom::TrainingArguments defaults;
    defaults.output_dir = "mine";
    const std::string program = "train";
    const char* argv[] = {program.c_str(), path.c_str(), "--max_steps", "3"};
    const auto [training, model] = loom::parse_args(4, argv, defaults, ModelArgs{});
    CHECK(training.output_dir == "mine");
    CHECK(training.seed == 9);
    CHECK(training.max_steps == 3);
    CHECK(model.model_name == "from_file");
  }
  SUBCASE("errors") {
    const std::string typo = write_text(dir.path / "typo.json", R"({"sead": 1})").string();
    CHECK_THROWS_WITH_AS((loom::try_parse_args<loom::TrainingArguments, ModelArgs>(std::vector<std::string>{typo})),
                         ("loom: " + typo + ": unknown JSON key 'sead'; did you mean 'seed'?").c_str(), loom::Error);
    // Only first: after a flag it is a stray argument.
    CHECK_THROWS_WITH_AS(
        (loom::try_parse_args<loom::TrainingArguments>(std::vector<std::string>{"--seed", "1", path})),
        ("loom: unexpected argument '" + path + "'; a JSON settings file must be the first argument, before the flags")
            .c_str(),
        loom::Error);
    CHECK_THROWS_WITH_AS((loom::try_parse_args<loom::TrainingArguments, ModelArgs>(std::vector<std::string>{path, path})),
                         ("loom: unexpected argument '" + path +
                          "'; a JSON settings file must be the first argument, before the flags")
                             .c_str(),
                         loom::Error);
    // --help wins, and reads no file.
    CHECK(loom::try_parse_args<loom::TrainingArguments>(std::vector<std::string>{"missing.json", "-h"}).help);
    // Not a settings file: a flag's value, or a name that only contains .json.
    CHECK(std::get<0>(loom::try_parse_args<loom::TrainingArguments>(std::vector<std::string>{"--output_dir", "x.json"})
                          .values)
              .output_dir == "x.json");
    CHECK_THROWS_WITH_AS(loom::try_parse_args<loom::TrainingArguments>(std::vector<std::string>{"a.json.bak"}),
                         "loom: unexpected argument 'a.json.bak'; flags look like --name value", loom::Error);
  }
}

// ---- which settings were given: GivenFlags ----------------------------------------------

namespace reflect_test {

// A user struct recording its own given flags, in the middle of its fields.
struct Recorded {
  int64_t depth = 2;
  loom::GivenFlags given_here;
  std::string mode = "fast";
};

// A field_help entry naming the GivenFlags field: it is no setting, so the entry names no field.
struct HelpForGiven {
  int64_t depth = 2;
  loom::GivenFlags given;
  static constexpr loom::FieldHelp field_help[] = {{"depth", "how deep"}, {"given", "not a flag"}};
};

}  // namespace reflect_test

TEST_CASE("GivenFlags: an explicit default is recorded, an absent flag is not") {
  const auto args = parse_one<loom::TrainingArguments>(
      {"--lr_scheduler_type", "linear", "--fp16", "--learning-rate=0.001", "--eval_steps", "none"});
  CHECK(args.lr_scheduler_type == loom::TrainingArguments{}.lr_scheduler_type);  // the default, given explicitly
  CHECK(args.given.contains("lr_scheduler_type"));
  CHECK(args.given.contains("fp16"));           // bare bool
  CHECK(args.given.contains("learning_rate"));  // --learning-rate=: the field's name
  CHECK(args.given.contains("eval_steps"));     // reset to none
  CHECK(args.given.names() == std::vector<std::string>{"eval_steps", "fp16", "learning_rate", "lr_scheduler_type"});
  CHECK_FALSE(args.given.contains("seed"));
  CHECK_FALSE(args.given.contains("learning-rate"));
  CHECK(parse_one<loom::TrainingArguments>({}).given.empty());
  CHECK(loom::TrainingArguments{}.given.empty());

  // Copies keep it.
  const loom::TrainingArguments copy = args;
  loom::TrainingArguments assigned;
  assigned = args;
  CHECK(copy.given == args.given);
  CHECK(assigned.given.contains("fp16"));
}

TEST_CASE("GivenFlags: each struct records its own flags; the field may stand anywhere") {
  const auto r = parse<loom::TrainingArguments, ModelArgs, reflect_test::Recorded>(
      {"--seed", "1", "--hidden_size", "3", "--mode", "fast", "--depth=4"});
  REQUIRE_FALSE(r.help);
  const auto& [training, model, recorded] = r.values;
  CHECK(training.given.names() == std::vector<std::string>{"seed"});
  CHECK(model.hidden_size == 3);
  CHECK(recorded.depth == 4);
  CHECK(recorded.mode == "fast");
  CHECK(recorded.given_here.names() == std::vector<std::string>{"depth", "mode"});

  // Not a flag: --given and --given_here are unknown.
  CHECK_THROWS_WITH_AS(parse<loom::TrainingArguments>({"--given", "x"}), "loom: unknown argument --given; see --help",
                       loom::Error);
  CHECK_THROWS_AS(parse<reflect_test::Recorded>({"--given_here", "x"}), loom::Error);

  // Flags add to what the starting values record.
  loom::TrainingArguments start;
  start.given.insert("output_dir");
  const auto more = loom::try_parse_args(reflect_test::argv_of({"--seed", "3"}), std::tuple<loom::TrainingArguments>{start});
  CHECK(std::get<0>(more.values).given.names() == std::vector<std::string>{"output_dir", "seed"});
}

TEST_CASE("GivenFlags: the keys of a JSON settings file are recorded") {
  reflect_test::TempDir dir;
  const std::string path =
      write_text(dir.path / "args.json", R"({"lr_scheduler_type": "linear", "model_name": "m", "depth": 5})").string();

  const auto r = loom::try_parse_args<loom::TrainingArguments, ModelArgs, reflect_test::Recorded>(
      std::vector<std::string>{path, "--seed", "1"});
  const auto& [training, model, recorded] = r.values;
  CHECK(training.given.names() == std::vector<std::string>{"lr_scheduler_type", "seed"});
  CHECK(model.model_name == "m");
  CHECK(recorded.given_here.names() == std::vector<std::string>{"depth"});

  // parse_json_file records them too.
  const auto [from_file, model2] = loom::parse_json_file<loom::TrainingArguments, ModelArgs>(
      write_text(dir.path / "two.json", R"({"seed": 42, "hidden_size": 8})"));
  CHECK(from_file.given.names() == std::vector<std::string>{"seed"});
  CHECK(model2.hidden_size == 8);

  // load_json / from_json read a file loom wrote: nothing is recorded.
  loom::save_json(from_file, dir.path / "training_args.json");
  CHECK(loom::load_json<loom::TrainingArguments>(dir.path / "training_args.json").given.empty());
  CHECK(loom::from_json<loom::TrainingArguments>(nlohmann::json::parse(R"({"seed": 1})")).given.empty());
}

TEST_CASE("GivenFlags: not written by to_json, not read by from_json, not in --help") {
  const auto args = parse_one<loom::TrainingArguments>({"--seed", "7", "--bf16"});
  REQUIRE_FALSE(args.given.empty());
  const auto j = loom::to_json(args);
  CHECK_FALSE(j.contains("given"));
  CHECK(j.size() == loom::to_json(loom::TrainingArguments{}).size());
  CHECK(std::prev(j.end()).key() == "fsdp");  // the last setting
  CHECK_THROWS_WITH_AS(loom::from_json<loom::TrainingArguments>(nlohmann::json::parse(R"({"given": ["seed"]})")),
                       "loom: unknown JSON key 'given'", loom::Error);
  const auto recorded = loom::to_json(reflect_test::Recorded{});
  CHECK(recorded == nlohmann::ordered_json::parse(R"({"depth": 2, "mode": "fast"})"));

  const std::string help = loom::help_text<loom::TrainingArguments, reflect_test::Recorded>("run");
  CHECK(help.find("--given") == std::string::npos);
  CHECK(help.find("\n  --depth <int>  (default: 2)\n  --mode <string>  (default: fast)\n") != std::string::npos);

  // The field checks skip it: it is counted as no setting, and a field_help entry naming it names no field.
  static_assert(loom::detail::given_flags_count<loom::TrainingArguments>() == 1);
  static_assert(loom::detail::setting_count<reflect_test::Recorded>() == boost::pfr::tuple_size_v<reflect_test::Recorded> - 1);
  static_assert(loom::detail::setting_names<reflect_test::Recorded>() ==
                std::array<std::string_view, 2>{"depth", "mode"});
  static_assert(loom::detail::bad_field_help_entry<reflect_test::HelpForGiven>(false) == 1);
  static_assert(loom::detail::field_names_unique<loom::TrainingArguments, reflect_test::HelpForGiven>());
}

// ---- nearest name -------------------------------------------------------------------------

TEST_CASE("levenshtein and nearest_name") {
  CHECK(loom::detail::levenshtein("kitten", "sitting") == 3);
  CHECK(loom::detail::levenshtein("", "abc") == 3);
  CHECK(loom::detail::levenshtein("same", "same") == 0);
  const std::vector<std::string_view> names = {"steps", "epoch", "no"};
  CHECK(loom::detail::nearest_name("step", names) == "steps");
  CHECK(loom::detail::nearest_name("epochs", names) == "epoch");
  CHECK(loom::detail::nearest_name("zzzzzzzz", names).empty());
  // Too far by edits, but a prefix of a candidate.
  const std::vector<std::string_view> optims = {"adamw_torch_fused", "adamw_torch", "sgd"};
  CHECK(loom::detail::nearest_name("adamw", optims) == "adamw_torch");
  const std::vector<std::string_view> long_names = {"adamw_torch_fused", "adamw_torch"};
  CHECK(loom::detail::nearest_name("ad", long_names).empty());  // prefixes need 3+ characters
}
