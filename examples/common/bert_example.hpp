#pragma once
// What the BERT examples (bert_classify, bert_mlm) share: the checks of their random-init size
// flags and the BertConfig those flags give on a folder of token files. `Flags` is an
// example's argument struct with the fields max_seq_length, num_hidden_layers, hidden_size,
// num_attention_heads, intermediate_size and dropout.

#include <loom/core/error.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/bert.hpp>

#include <cstdint>

namespace bert_example {

/// Checks the size flags right after parsing: each a `loom:` line naming the flag.
/// `min_length` is the shortest --max_seq_length the example's examples fit in.
template <class Flags>
void check_size_flags(const Flags& f, int64_t min_length, const char* shortest) {
  loom::check(f.max_seq_length >= min_length, "--max_seq_length must be at least {} ({}), got {}", min_length,
              shortest, f.max_seq_length);
  loom::check(f.num_hidden_layers > 0, "--num_hidden_layers must be positive, got {}", f.num_hidden_layers);
  loom::check(f.num_attention_heads > 0, "--num_attention_heads must be positive, got {}", f.num_attention_heads);
  loom::check(f.hidden_size > 0 && f.hidden_size % f.num_attention_heads == 0,
              "--hidden_size must be a positive multiple of --num_attention_heads {}, got {}", f.num_attention_heads,
              f.hidden_size);
  loom::check(f.intermediate_size > 0, "--intermediate_size must be positive, got {}", f.intermediate_size);
  loom::check(f.dropout >= 0 && f.dropout < 1, "--dropout must lie in [0, 1), got {}", f.dropout);
}

/// The BertConfig of a random init sized by the flags, with the data's vocabulary and padding id
/// (positions: --max_seq_length).
template <class Flags>
loom::models::BertConfig random_config(const Flags& f, const loom::data::TokenFileMeta& meta) {
  loom::models::BertConfig config;
  config.vocab_size = meta.vocab_size;
  config.hidden_size = f.hidden_size;
  config.num_hidden_layers = f.num_hidden_layers;
  config.num_attention_heads = f.num_attention_heads;
  config.intermediate_size = f.intermediate_size;
  config.max_position_embeddings = f.max_seq_length;
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = f.dropout;
  config.pad_token_id = meta.pad_token_id;
  return config;
}

}  // namespace bert_example
