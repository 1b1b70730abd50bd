#pragma once
// What the Llama examples share (llama_sft, llama_dpo): the flags that size a random base, and
// the base's configuration before any data, from --model_name_or_path's config.json or from
// those flags and the token folder.

#include <loom/data/token_file.hpp>
#include <loom/loom.hpp>
#include <loom/models/llama.hpp>

#include <cstdint>
#include <string_view>

namespace llama_example {

/// The size of a random base (without --model_name_or_path).
struct RandomBaseArguments {
  int64_t hidden_size = 256;        ///< model width
  int64_t intermediate_size = 688;  ///< the MLP's width
  int64_t num_hidden_layers = 4;    ///< decoder layers
  int64_t num_attention_heads = 8;  ///< query heads
  int64_t num_key_value_heads = 4;  ///< key/value heads (grouped-query attention)

  static constexpr loom::FieldHelp field_help[] = {
      {"hidden_size", "model width (random init, without --model_name_or_path)"},
      {"intermediate_size", "the MLP's width (random init)"},
      {"num_hidden_layers", "decoder layers (random init)"},
      {"num_attention_heads", "query heads (random init)"},
      {"num_key_value_heads", "key/value heads, dividing the query heads (random init)"},
  };
  static constexpr std::string_view help_heading = "random base";
};

/// The base's configuration: --model_name_or_path's config.json (its vocabulary must hold the
/// token folder's ids), or a random base sized by `shape` over the folder's vocabulary with
/// `positions` positions, the folder's eos as bos and eos, and its pad id.
inline loom::models::LlamaConfig base_config(const loom::TrainingArguments& args, const RandomBaseArguments& shape,
                                             const loom::data::TokenFileMeta& meta, std::string_view data_dir,
                                             int64_t positions) {
  loom::models::LlamaConfig config;
  if (args.model_name_or_path) {
    config = loom::models::read_hf_config<loom::models::LlamaConfig>(*args.model_name_or_path);
    loom::check(config.vocab_size >= meta.vocab_size,
                "--model_name_or_path {} has vocab_size {}, but the token files of {} use {} ids",
                *args.model_name_or_path, config.vocab_size, data_dir, meta.vocab_size);
    return config;
  }
  config.vocab_size = meta.vocab_size;
  config.hidden_size = shape.hidden_size;
  config.intermediate_size = shape.intermediate_size;
  config.num_hidden_layers = shape.num_hidden_layers;
  config.num_attention_heads = shape.num_attention_heads;
  config.num_key_value_heads = shape.num_key_value_heads;
  config.max_position_embeddings = positions;
  if (meta.eos_token_id) config.bos_token_id = config.eos_token_id = *meta.eos_token_id;
  config.pad_token_id = meta.pad_token_id;
  return config;
}

}  // namespace llama_example
