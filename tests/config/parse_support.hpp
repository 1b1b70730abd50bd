#pragma once
// What the command-line tests of tests/config share: a command line parsed, validated and
// finalized as a program's start-up does it, or the loom::Error it ends in.
#include <loom/config/reflect.hpp>
#include <loom/config/validate.hpp>

#include <string>
#include <vector>

namespace config_test {

/// The arguments `flags` parse to, validated and finalized.
inline loom::TrainingArguments parsed(std::vector<std::string> flags) {
  auto args = std::get<0>(loom::try_parse_args<loom::TrainingArguments>(flags).values);
  loom::validate(args);
  loom::finalize(args);
  return args;
}

/// The loom::Error message parsing and validating `flags` gives ("" when none).
inline std::string error_of(std::vector<std::string> flags) {
  try {
    (void)parsed(std::move(flags));
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace config_test
