// expect: flag_defined_by_two_structs<loom::detail::Name<'s', 'e', 'e', 'd'>, loom::TrainingArguments, ModelArgs>
// A flag defined by two structs parsed together: the message names the flag and both structs.
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>

#include <cstdint>

struct ModelArgs {
  int64_t hidden_size = 64;
  int64_t seed = 0;  // TrainingArguments has --seed too
};

int main(int argc, char** argv) {
  auto [args, model] = loom::parse_args<loom::TrainingArguments, ModelArgs>(argc, argv);
  return static_cast<int>(args.seed + model.seed);
}
