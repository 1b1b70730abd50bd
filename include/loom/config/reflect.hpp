#pragma once
// Reflection over plain aggregates (TrainingArguments, a user's ModelArgs, ...) with
// Boost.PFR: the umbrella of its four headers, one per job (as Boost.PFR keeps one header
// per feature):
//   config/fields.hpp    the supported field types, the compile-time checks of a struct and of
//                        its field_help table, --help headings, the flat field table
//   config/text.hpp      a flag's text -> a field's value, and a value -> --help's text
//   config/cli.hpp       parse_args / try_parse_args over one or several structs, help_text
//   config/json_io.hpp   to_json / from_json, save_json / load_json, parse_json_file,
//                        loom::json::describe and the atomic loom::json::write_file
// A loom::GivenFlags field (config/given_flags.hpp) records which settings a parse was given.

#include <loom/config/cli.hpp>
#include <loom/config/fields.hpp>
#include <loom/config/given_flags.hpp>
#include <loom/config/json_io.hpp>
#include <loom/config/nearest.hpp>
#include <loom/config/text.hpp>
