#pragma once
// bitsandbytes' 4-bit weights, the base of QLoRA (Dettmers et al., 2023): a weight is cut into
// blocks of 64 values in row-major order; each block keeps its absolute maximum (absmax,
// float32) and each value the index of the nearest of 16 codes (NF4: quantiles of a normal
// distribution; FP4: a 1-2-1 float) after dividing by the absmax, two indices a byte with the
// first in the high nibble. Double quantization (bnb_4bit_use_double_quant, TRL's
// --use_bnb_nested_quant) stores the absmaxes again in 8 bits: their mean (the offset) is
// subtracted and the rest quantized blockwise, 256 to a block, with bitsandbytes' signed
// dynamic map. The codes, absmaxes and offsets equal bitsandbytes.functional.quantize_4bit's on
// the same float32 weights (its CPU kernels: tests/models/hf_qlora.py compares them byte
// for byte), so a layer computes what bitsandbytes' Linear4bit computes:
//
//   auto q = loom::peft::quantize_4bit(weight, loom::peft::Bnb4Type::nf4, /*nested=*/true);
//   torch::Tensor w = loom::peft::dequantize_4bit(q, torch::kFloat);        // [out, in] again, approximately
//   torch::Tensor y = loom::peft::linear_4bit(x, q, bias);                    // x W^T + b, gradient to x only
//
// linear_4bit dequantizes in its forward and again in its backward, as bitsandbytes'
// MatMul4Bit does: the graph keeps the 4-bit tensors, never a float copy of the weight.
// Bytes per value: 0.5 for the codes, plus 4 / 64 for float32 absmaxes, or 1 / 64 + 4 / 16384
// double-quantized (q.bytes()).

#include <loom/config/inline.hpp>
#include <loom/core/deferred.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::peft {

/// The 4-bit data types of bitsandbytes (BitsAndBytesConfig's bnb_4bit_quant_type).
enum class Bnb4Type { nf4, fp4 };

/// "nf4" or "fp4".
[[nodiscard]] LOOM_INLINE std::string_view bnb4_type_name(Bnb4Type type);
/// The type `name` names ("nf4", "fp4"); anything else is a loom::Error naming `where`.
[[nodiscard]] LOOM_INLINE Bnb4Type bnb4_type_from_name(std::string_view name, std::string_view where);

/// A weight in bitsandbytes' 4-bit format (its QuantState's tensors, by the names
/// transformers serializes them under: weight, weight.absmax, weight.nested_absmax, ...).
struct Bnb4Weight {
  torch::Tensor packed;         ///< uint8 [(numel + 1) / 2, 1]: two code indices a byte, the first in the high nibble
  torch::Tensor absmax;         ///< each block's absmax: float32 [blocks], or uint8 [blocks] double-quantized
  torch::Tensor nested_absmax;  ///< double quantization: the absmaxes' own absmax per 256 blocks (float32), else undefined
  torch::Tensor offset;         ///< double quantization: the mean absmax subtracted before (float32, 0-dim), else undefined
  Bnb4Type quant_type = Bnb4Type::nf4;
  int64_t blocksize = 64;
  std::vector<int64_t> shape;          ///< the weight's shape ([out, in] for a linear layer)
  torch::ScalarType dtype = torch::kFloat;  ///< the dtype it was quantized from

  [[nodiscard]] bool nested() const { return nested_absmax.defined(); }
  [[nodiscard]] int64_t numel() const;
  /// Bytes the 4-bit state holds (codes, absmaxes, and the nested absmaxes and offset).
  [[nodiscard]] LOOM_INLINE int64_t bytes() const;
  /// Each block's absmax in float32 (double quantization undone as bitsandbytes undoes it:
  /// code[q] * nested absmax, then + offset).
  [[nodiscard]] LOOM_INLINE torch::Tensor block_absmax() const;
  /// The same state on `device`.
  [[nodiscard]] LOOM_INLINE Bnb4Weight to(const torch::Device& device) const;
};

inline int64_t Bnb4Weight::numel() const {
  int64_t n = 1;
  for (const auto s : shape) n *= s;
  return n;
}

/// The 16 values of `type` (bitsandbytes' get_4bit_type), float32, in code order.
[[nodiscard]] LOOM_INLINE torch::Tensor code_4bit(Bnb4Type type);
/// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map), float32 [256], sorted (the map
/// double quantization uses).
[[nodiscard]] LOOM_INLINE const torch::Tensor& dynamic_map_8bit();

/// bitsandbytes' quantize_4bit of `weight` (a floating-point tensor of any shape, quantized in
/// float32) with blocks of `blocksize` values; `nested`: double-quantize the absmaxes.
[[nodiscard]] LOOM_INLINE Bnb4Weight quantize_4bit(const torch::Tensor& weight, Bnb4Type type, bool nested,
                                                   int64_t blocksize = 64);
/// The state quantize_4bit gives a weight of `shape` and `dtype` on `device`, with the same
/// shapes and dtypes but storage-less tensors (core/deferred.hpp): a 4-bit weight not computed
/// yet (a model built under loom::DeferredInit), whose size is known.
[[nodiscard]] LOOM_INLINE Bnb4Weight storage_less_4bit(const std::vector<int64_t>& shape, torch::ScalarType dtype,
                                                      Bnb4Type type, bool nested, const torch::Device& device,
                                                      int64_t blocksize = 64);
/// The weight `q` holds, in `dtype` (each value code * its block's absmax, in float32, then
/// rounded to `dtype`), on q's device.
[[nodiscard]] LOOM_INLINE torch::Tensor dequantize_4bit(const Bnb4Weight& q, torch::ScalarType dtype);

/// bitsandbytes' blockwise 8-bit quantization (quantize_blockwise on the CPU): per block of
/// `blocksize` values its absmax, and each value / absmax as the index of an entry of `code`
/// (256 sorted values) near it, chosen as bitsandbytes' CPU kernel chooses (through a table of
/// 65536 points: the nearest entry but for values within 1/65535 of a midpoint). Returns the
/// indices (uint8, a's shape) and the absmaxes.
[[nodiscard]] LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> quantize_blockwise_8bit(const torch::Tensor& a,
                                                                                          const torch::Tensor& code,
                                                                                          int64_t blocksize);
/// Its inverse: code[index] * absmax of the index's block (float32).
[[nodiscard]] LOOM_INLINE torch::Tensor dequantize_blockwise_8bit(const torch::Tensor& indices,
                                                                  const torch::Tensor& absmax,
                                                                  const torch::Tensor& code, int64_t blocksize);

/// x W^T (+ bias) with W the 4-bit weight `q` ([out, in]), dequantized to x's dtype: bitsandbytes'
/// matmul_4bit. Gradients flow to x and bias, not to the 4-bit weight, and the backward
/// dequantizes again instead of keeping the float weight alive in the graph.
[[nodiscard]] LOOM_INLINE torch::Tensor linear_4bit(const torch::Tensor& x, const Bnb4Weight& q,
                                                    const torch::Tensor& bias);

}  // namespace loom::peft

#if defined(LOOM_HEADER_ONLY)
#include <loom/peft/impl/bnb4.ipp>
#endif
