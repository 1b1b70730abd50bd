#pragma once
// Field-by-field operations on aggregate batches, through Boost.PFR reflection: a batch is
// any aggregate whose fields are torch::Tensor (e.g. struct { Tensor images, labels; }).

#include <loom/core/error.hpp>

#include <boost/pfr.hpp>
#include <torch/torch.h>

#include <string_view>
#include <type_traits>
#include <vector>

namespace loom::data {

/// An aggregate whose every field is a torch::Tensor: loom's batch and example shape.
template <class T>
concept TensorAggregate = std::is_aggregate_v<T> && std::is_default_constructible_v<T> &&
                          []<std::size_t... I>(std::index_sequence<I...>) {
                            return (std::is_same_v<boost::pfr::tuple_element_t<I, T>, torch::Tensor> && ...);
                          }(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});

namespace detail {

// A field name as a template argument, so that a compiler error shows it.
template <std::size_t N>
struct FieldName {
  char text[N]{};
  constexpr explicit FieldName(std::string_view s) {
    for (std::size_t i = 0; i + 1 < N; ++i) text[i] = s[i];
  }
};

// Instantiated for each field of a batch type; the compiler's "in instantiation of
// batch_field<FieldName<N>{"name"}, Type>" line above the error names the field and its type.
template <FieldName Name, class T>
struct batch_field {
  static_assert(std::is_same_v<T, torch::Tensor>,
                "loom: every field of the batch type must be a torch::Tensor; the field's name and type are in "
                "`batch_field<FieldName<N>{\"name\"}, Type>` above");
  static constexpr bool ok = std::is_same_v<T, torch::Tensor>;
};

}  // namespace detail

/// Checks each field of the aggregate `B` with a compile error naming the first field that is
/// not a torch::Tensor; true when all are.
template <class B>
constexpr bool batch_fields_are_tensors() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return (detail::batch_field<detail::FieldName<boost::pfr::get_name<I, B>().size() + 1>(boost::pfr::get_name<I, B>()),
                                boost::pfr::tuple_element_t<I, B>>::ok && ...);
  }(std::make_index_sequence<boost::pfr::tuple_size_v<B>>{});
}

/// Stacks a list of examples into one batch, field by field (torch::stack on dim 0). A field
/// left undefined in every example (an absent column, e.g. the labels of a test set) stays
/// undefined; one undefined in some examples only is a loom::Error naming it.
template <TensorAggregate Example>
Example collate(const std::vector<Example>& examples) {
  check(!examples.empty(), "collate needs at least one example");
  constexpr auto names = boost::pfr::names_as_array<Example>();
  Example batch{};
  std::vector<torch::Tensor> column;
  column.reserve(examples.size());
  boost::pfr::for_each_field(batch, [&](torch::Tensor& out, std::size_t i) {
    column.clear();
    std::size_t undefined = 0;
    for (const auto& e : examples) {
      boost::pfr::for_each_field(e, [&](const torch::Tensor& t, std::size_t j) {
        if (j != i) return;
        if (t.defined()) column.push_back(t);
        else ++undefined;
      });
    }
    check(undefined == 0 || column.empty(), "field '{}' is undefined in {} of {} examples of a batch; a field must "
          "be set in every example or in none", names[i], undefined, examples.size());
    if (!column.empty()) out = torch::stack(column);
  });
  return batch;
}

/// Moves every tensor field of `batch` to `device` (non-blocking where the copy allows).
template <TensorAggregate Batch>
void to_device(Batch& batch, const torch::Device& device, bool non_blocking = true) {
  boost::pfr::for_each_field(batch, [&](torch::Tensor& t) {
    if (t.defined() && t.device() != device) t = t.to(device, non_blocking);
  });
}

/// Casts every floating-point field of `batch` to `dtype` (evaluation of a model cast to bf16 / fp16).
template <TensorAggregate Batch>
void cast_floating(Batch& batch, torch::ScalarType dtype) {
  boost::pfr::for_each_field(batch, [&](torch::Tensor& t) {
    if (t.defined() && t.is_floating_point()) t = t.to(dtype);
  });
}

/// Rows `index` (a 1-D int64 tensor) of every field, as one batch (undefined fields stay so).
template <TensorAggregate Batch>
Batch index_rows(const Batch& full, const torch::Tensor& index) {
  Batch out{};
  boost::pfr::for_each_field(out, [&](torch::Tensor& dst, std::size_t i) {
    boost::pfr::for_each_field(full, [&](const torch::Tensor& src, std::size_t j) {
      if (j == i && src.defined()) dst = src.index_select(0, index);
    });
  });
  return out;
}

/// Number of rows of a batch: the first dimension of its first field.
template <TensorAggregate Batch>
int64_t batch_rows(const Batch& batch) {
  const torch::Tensor& first = boost::pfr::get<0>(batch);
  return first.defined() && first.dim() > 0 ? first.size(0) : 0;
}

/// The field called `name`, or nullptr when the batch has none.
template <TensorAggregate Batch>
const torch::Tensor* field_named(const Batch& batch, std::string_view name) {
  const torch::Tensor* found = nullptr;
  constexpr auto names = boost::pfr::names_as_array<Batch>();
  boost::pfr::for_each_field(batch, [&](const torch::Tensor& t, std::size_t i) {
    if (names[i] == name) found = &t;
  });
  return found;
}

}  // namespace loom::data
