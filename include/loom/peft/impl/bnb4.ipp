#pragma once
// Definitions of peft/bnb4.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/peft/bnb4.hpp>

#include <ATen/Parallel.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace loom::peft {

namespace detail {
// bitsandbytes' get_4bit_type tables, in code order (index = the 4-bit value). FP4 lists
// 1 sign, 2 exponent and 1 mantissa bit values, divided by their largest (12) as
// bitsandbytes divides them.
inline constexpr std::array<double, 16> kNf4Values = {
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0};
inline constexpr std::array<double, 16> kFp4Values = {0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0,
                                                      -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0};
inline constexpr std::array<int64_t, 8> kBlocksizes = {32, 64, 128, 256, 512, 1024, 2048, 4096};
inline constexpr int64_t kNestedBlocksize = 256;  // bitsandbytes' double quantization: 256 absmaxes a block

inline torch::Tensor float_table(const std::array<double, 16>& values) {
  std::vector<float> v(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) v[i] = static_cast<float>(values[i]);
  return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, torch::kFloat).clone();
}

// The backward of linear_4bit needs the 4-bit state, not a float weight: its tensors are saved
// (references, no copies) and its sizes in saved_data.
struct Linear4bitFunction : torch::autograd::Function<Linear4bitFunction> {
  // The bias as an optional: an undefined tensor cannot be a Function's input.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const std::optional<torch::Tensor>& bias_in, const Bnb4Weight* q) {
    const auto bias = bias_in.value_or(torch::Tensor());
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->save_for_backward({q->packed, q->absmax, q->nested_absmax, q->offset});
    ctx->saved_data["quant_type"] = static_cast<int64_t>(q->quant_type);
    ctx->saved_data["blocksize"] = q->blocksize;
    ctx->saved_data["shape"] = q->shape;
    ctx->saved_data["dtype"] = static_cast<int64_t>(q->dtype);
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : x.scalar_type());
    // bitsandbytes' gemm_4bit: the weight dequantized to the input's dtype, then linear.
    return torch::nn::functional::linear(x, dequantize_4bit(*q, x.scalar_type()), bias);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    Bnb4Weight q;
    q.packed = saved[0];
    q.absmax = saved[1];
    q.nested_absmax = saved[2];
    q.offset = saved[3];
    q.quant_type = static_cast<Bnb4Type>(ctx->saved_data["quant_type"].toInt());
    q.blocksize = ctx->saved_data["blocksize"].toInt();
    q.shape = ctx->saved_data["shape"].toIntVector();
    q.dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto& g = grads[0];
    torch::Tensor grad_x, grad_bias;
    // MatMul4Bit.backward: the bias's gradient summed over the rows, the input's through the
    // weight dequantized again, in the dtype it was quantized from and then the gradient's (the
    // forward dequantizes to the input's dtype directly); none for the 4-bit weight.
    // (the edges are the tensor inputs': x, then the bias when there is one)
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(1))
      grad_bias = g.reshape({-1, g.size(-1)}).sum(0).to(static_cast<torch::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    if (ctx->needs_input_grad(0)) grad_x = torch::matmul(g, dequantize_4bit(q, q.dtype).to(g.scalar_type()));
    return {grad_x, grad_bias, torch::Tensor()};
  }
};
}  // namespace detail

LOOM_INLINE std::string_view bnb4_type_name(Bnb4Type type) { return type == Bnb4Type::nf4 ? "nf4" : "fp4"; }

LOOM_INLINE Bnb4Type bnb4_type_from_name(std::string_view name, std::string_view where) {
  if (name == "nf4") return Bnb4Type::nf4;
  if (name == "fp4") return Bnb4Type::fp4;
  fail("{}: 4-bit quant type \"{}\" is not one bitsandbytes has: \"nf4\" or \"fp4\"", where, name);
}

LOOM_INLINE torch::Tensor code_4bit(Bnb4Type type) {
  auto code = detail::float_table(type == Bnb4Type::nf4 ? detail::kNf4Values : detail::kFp4Values);
  code.div_(code.abs().max());
  return code;
}

LOOM_INLINE const torch::Tensor& dynamic_map_8bit() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponents 10^-6 ..
  // 10^0, 2^i fractions each (the midpoints of linspace(0.1, 1, 2^i + 1) in float32), both
  // signs, then 0 and 1, sorted.
  static const torch::Tensor map = [] {
    std::vector<float> data;
    for (int i = 0; i < 7; ++i) {
      const auto bounds = torch::linspace(0.1, 1, (int64_t{1} << i) + 1, torch::kFloat);
      const auto means = (bounds.slice(0, 0, -1) + bounds.slice(0, 1)) / 2.0;
      const double scale = std::pow(10.0, -6 + i);
      const auto pos = (means * scale).contiguous(), neg = (means * -scale).contiguous();
      for (const auto& t : {pos, neg})
        data.insert(data.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    }
    data.push_back(0.0F);
    data.push_back(1.0F);
    std::sort(data.begin(), data.end());
    return torch::from_blob(data.data(), {static_cast<int64_t>(data.size())}, torch::kFloat).clone();
  }();
  return map;
}

LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> quantize_blockwise_8bit(const torch::Tensor& a,
                                                                            const torch::Tensor& code,
                                                                            int64_t blocksize) {
  check(blocksize > 0, "quantize_blockwise_8bit: blocksize must be positive, got {}", blocksize);
  check(code.numel() == 256, "quantize_blockwise_8bit: the code must hold 256 values, got {}", code.numel());
  const auto flat = a.detach().reshape(-1).to(torch::kCPU, torch::kFloat).contiguous();
  const auto map = code.to(torch::kCPU, torch::kFloat).contiguous();
  const float* c = map.data_ptr<float>();
  // bitsandbytes' CPU quantizer (0.50) does not search the code for each value: it reads a
  // table of 65536 evenly spaced points of [-1, 1], each holding the entry whose midpoints
  // bracket it (midpoint (c[k] + c[k+1]) / 2 in float32; a point on a midpoint goes down), and
  // rounds value / absmax to the nearest point. So a value near a midpoint can get the farther
  // entry; the same table here gives the same bytes.
  constexpr int kPoints = 65536;
  std::array<float, 255> mid{};
  for (int k = 0; k < 255; ++k) mid[static_cast<std::size_t>(k)] = 0.5F * (c[k] + c[k + 1]);
  std::vector<uint8_t> table(kPoints);
  int entry = 0;
  for (int i = 0; i < kPoints; ++i) {
    const float twice = 2.0F * static_cast<float>(i);
    const float step = twice / static_cast<float>(kPoints - 1);
    const float point = -1.0F + step;
    while (entry < 255 && mid[static_cast<std::size_t>(entry)] < point) ++entry;
    table[static_cast<std::size_t>(i)] = static_cast<uint8_t>(entry);
  }
  const int64_t n = flat.numel(), blocks = (n + blocksize - 1) / blocksize;
  auto out = torch::empty({n}, torch::kUInt8);
  auto absmax = torch::empty({blocks}, torch::kFloat);
  const float* in = flat.data_ptr<float>();
  uint8_t* o = out.data_ptr<uint8_t>();
  float* am = absmax.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * blocksize, end = std::min(n, begin + blocksize);
    float m = 0.0F;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(in[i]));
    am[b] = m;
    if (m == 0.0F) {
      std::fill(o + begin, o + end, uint8_t{0});
      continue;
    }
    const float inverse = 1.0F / m;
    for (int64_t i = begin; i < end; ++i) {
      // One rounding per step (no fused multiply-add), as bitsandbytes' scalar loop computes it.
      const float z = std::clamp(in[i] * inverse, -1.0F, 1.0F);
      const float half = (z + 1.0F) * 0.5F;
      const float scaled = half * static_cast<float>(kPoints - 1);
      const float rounded = scaled + 0.5F;
      o[i] = table[static_cast<std::size_t>(static_cast<uint16_t>(rounded))];
    }
  }
  return {out.reshape(a.sizes()).to(a.device()), absmax.to(a.device())};
}

LOOM_INLINE torch::Tensor dequantize_blockwise_8bit(const torch::Tensor& indices, const torch::Tensor& absmax,
                                                    const torch::Tensor& code, int64_t blocksize) {
  const auto n = indices.numel();
  const auto values = code.to(indices.device(), torch::kFloat).index_select(0, indices.reshape(-1).to(torch::kLong));
  const auto block = torch::div(torch::arange(n, torch::TensorOptions().dtype(torch::kLong).device(indices.device())),
                                blocksize, "floor");
  return (values * absmax.to(torch::kFloat).index_select(0, block)).reshape(indices.sizes());
}

LOOM_INLINE torch::Tensor Bnb4Weight::block_absmax() const {
  if (!nested()) return absmax;
  return dequantize_blockwise_8bit(absmax, nested_absmax, dynamic_map_8bit(), detail::kNestedBlocksize) + offset;
}

LOOM_INLINE int64_t Bnb4Weight::bytes() const {
  int64_t b = 0;
  for (const auto* t : {&packed, &absmax, &nested_absmax, &offset})
    if (t->defined()) b += t->numel() * static_cast<int64_t>(t->element_size());
  return b;
}

LOOM_INLINE Bnb4Weight Bnb4Weight::to(const torch::Device& device) const {
  Bnb4Weight out = *this;
  for (auto* t : {&out.packed, &out.absmax, &out.nested_absmax, &out.offset})
    if (t->defined()) *t = t->to(device);
  return out;
}

LOOM_INLINE Bnb4Weight quantize_4bit(const torch::Tensor& weight, Bnb4Type type, bool nested, int64_t blocksize) {
  const auto dtype = weight.scalar_type();
  check(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf,
        "quantize_4bit: bitsandbytes quantizes 16- and 32-bit floats, got a {} tensor", c10::toString(dtype));
  check(std::find(detail::kBlocksizes.begin(), detail::kBlocksizes.end(), blocksize) != detail::kBlocksizes.end(),
        "quantize_4bit: blocksize {} is not one bitsandbytes has (32, 64, ..., 4096)", blocksize);
  check(weight.numel() > 0, "quantize_4bit: the tensor is empty");
  torch::NoGradGuard no_grad;
  // bitsandbytes' quantize_4bit kernel (its default, the one its CPU backend runs): each value
  // times 1 / its block's absmax (a last short block: divided by it), clamped to [-1, 1],
  // bucketed between the midpoints of the sorted codes (a value on a midpoint goes down).
  const auto code = code_4bit(type).to(weight.device());
  const auto order = torch::argsort(code);
  const auto sorted = code.index_select(0, order);
  const auto bounds = (sorted.slice(0, 0, -1) + sorted.slice(0, 1)) / 2;
  const auto flat = weight.detach().reshape(-1).to(torch::kFloat);
  const int64_t n = flat.numel(), rem = n % blocksize, full = n - rem, blocks = full / blocksize;
  const auto body = flat.slice(0, 0, full).reshape({blocks, blocksize});
  auto absmax = std::get<0>(body.abs().max(-1));
  auto scaled = torch::clamp(body * absmax.clamp_min(1e-38).reciprocal().view({-1, 1}), -1, 1).reshape(-1);
  if (rem != 0) {
    const auto tail = flat.slice(0, full);
    const auto am = tail.abs().max().clamp_min(1e-38);
    absmax = torch::cat({absmax, am.unsqueeze(0)});
    scaled = torch::cat({scaled, torch::clamp(tail / am, -1, 1)});
  }
  if (scaled.numel() % 2 != 0) scaled = torch::nn::functional::pad(scaled, torch::nn::functional::PadFuncOptions({0, 1}));
  auto q = torch::bucketize(scaled, bounds, /*out_int32=*/true);
  if (type != Bnb4Type::nf4) q = order.index_select(0, q.to(torch::kLong));
  const auto q8 = q.to(torch::kUInt8);
  const auto packed =
      torch::bitwise_or(torch::bitwise_left_shift(q8.slice(0, 0, c10::nullopt, 2), 4), q8.slice(0, 1, c10::nullopt, 2))
          .unsqueeze(1);

  Bnb4Weight out;
  out.packed = packed;
  out.quant_type = type;
  out.blocksize = blocksize;
  out.shape = weight.sizes().vec();
  out.dtype = dtype;
  if (!nested) {
    out.absmax = absmax;
    return out;
  }
  // Double quantization (compress_statistics): the absmaxes less their mean, quantized
  // blockwise in 8 bits, 256 to a block, with the signed dynamic map.
  out.offset = absmax.mean();
  auto [indices, nested_absmax] = quantize_blockwise_8bit(absmax - out.offset, dynamic_map_8bit(), detail::kNestedBlocksize);
  out.absmax = indices;
  out.nested_absmax = nested_absmax;
  return out;
}

LOOM_INLINE Bnb4Weight storage_less_4bit(const std::vector<int64_t>& shape, torch::ScalarType dtype, Bnb4Type type,
                                         bool nested, const torch::Device& device, int64_t blocksize) {
  Bnb4Weight out;
  out.quant_type = type;
  out.blocksize = blocksize;
  out.shape = shape;
  out.dtype = dtype;
  const int64_t n = out.numel(), blocks = (n + blocksize - 1) / blocksize;
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  const auto floats = bytes.dtype(torch::kFloat);
  out.packed = storage_less({(n + 1) / 2, 1}, bytes);
  if (!nested) {
    out.absmax = storage_less({blocks}, floats);
    return out;
  }
  out.absmax = storage_less({blocks}, bytes);
  out.nested_absmax = storage_less({(blocks + detail::kNestedBlocksize - 1) / detail::kNestedBlocksize}, floats);
  out.offset = storage_less({}, floats);
  return out;
}

LOOM_INLINE torch::Tensor dequantize_4bit(const Bnb4Weight& q, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const int64_t n = q.numel();
  const auto code = code_4bit(q.quant_type);
  if (!q.packed.device().is_cpu()) {
    // On a device: the same arithmetic in tensor ops (each value code * absmax in float32).
    const auto bytes = q.packed.reshape(-1);
    const auto hi = torch::bitwise_right_shift(bytes, 4), lo = torch::bitwise_and(bytes, 15);
    const auto idx = torch::stack({hi, lo}, 1).reshape(-1).slice(0, 0, n).to(torch::kLong);
    const auto values = code.to(bytes.device()).index_select(0, idx);
    const auto block = torch::div(torch::arange(n, idx.options()), q.blocksize, "floor");
    return (values * q.block_absmax().to(torch::kFloat).index_select(0, block)).reshape(q.shape).to(dtype);
  }
  const auto scales = q.block_absmax().to(torch::kFloat).contiguous();
  const auto packed = q.packed.contiguous();
  auto out = torch::empty({n}, torch::kFloat);
  const uint8_t* in = packed.data_ptr<uint8_t>();
  const float* s = scales.data_ptr<float>();
  const float* c = code.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t blocks = (n + q.blocksize - 1) / q.blocksize;
  at::parallel_for(0, blocks, 16, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const float scale = s[b];
      const int64_t end = std::min(n, (b + 1) * q.blocksize);
      for (int64_t i = b * q.blocksize; i < end; ++i) {
        const uint8_t byte = in[i >> 1];
        o[i] = c[(i & 1) != 0 ? (byte & 15) : (byte >> 4)] * scale;
      }
    }
  });
  return out.reshape(q.shape).to(dtype);
}

LOOM_INLINE torch::Tensor linear_4bit(const torch::Tensor& x, const Bnb4Weight& q, const torch::Tensor& bias) {
  check(q.shape.size() == 2 && x.size(-1) == q.shape[1],
        "linear_4bit: the input's last dimension {} does not match the 4-bit weight's shape [{}]", x.size(-1),
        fmt::join(q.shape, ", "));
  return detail::Linear4bitFunction::apply(x, bias.defined() ? std::optional<torch::Tensor>(bias) : std::nullopt, &q);
}

}  // namespace loom::peft
