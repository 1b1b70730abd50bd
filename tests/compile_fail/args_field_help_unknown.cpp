// expect: field_help_names_no_field<loom::detail::Name<'h', 'i', 'd', 'e', 'n'>, ModelArgs>
// A field_help entry that names no field (a typo): the message names the entry and the struct.
#include <loom/config/field_help.hpp>
#include <loom/config/reflect.hpp>

#include <cstdint>

struct ModelArgs {
  int64_t hidden = 64;
  static constexpr loom::FieldHelp field_help[] = {{"hiden", "width of the hidden layers"}};
};

int main(int argc, char** argv) { return static_cast<int>(loom::parse_args<ModelArgs>(argc, argv).hidden); }
