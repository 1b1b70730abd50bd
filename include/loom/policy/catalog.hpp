#pragma once
// Reading a family's catalog (the std::tuple lists of policy/tags.hpp): its members' names,
// a fold over its members, and the member a name chooses. Validation, --help, the runtime
// selector and the factories use these instead of writing a member's name again.

#include <loom/policy/tags.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace loom {

namespace detail {
template <class Tag>
constexpr std::string_view member_name() {
  if constexpr (requires { Tag::facts.name; }) return Tag::facts.name;
  else return Tag::name;
}
template <class Catalog>
struct catalog_of;
template <class... Tags>
struct catalog_of<std::tuple<Tags...>> {
  static constexpr std::array<std::string_view, sizeof...(Tags)> names{member_name<Tags>()...};
  template <class F>
  static constexpr void each(F& f) {
    (f.template operator()<Tags>(), ...);
  }
  template <class F>
  static constexpr bool visit(std::string_view name, F& f) {
    return ((member_name<Tags>() == name ? (f.template operator()<Tags>(), true) : false) || ...);
  }
  template <class Tag>
  static constexpr bool contains = (std::is_same_v<Tag, Tags> || ...);
};
}  // namespace detail

/// The names of `Catalog`'s members, in its order.
template <class Catalog>
inline constexpr auto catalog_names = detail::catalog_of<Catalog>::names;

/// True when `Tag` is a member of `Catalog`.
template <class Catalog, class Tag>
inline constexpr bool in_catalog = detail::catalog_of<Catalog>::template contains<Tag>;

/// Calls `f.template operator()<Tag>()` for each member of `Catalog`, in order.
template <class Catalog, class F>
constexpr void for_each_member(F&& f) {
  detail::catalog_of<Catalog>::each(f);
}

/// Calls `f.template operator()<Tag>()` for the member of `Catalog` called `name`; false when
/// none is.
template <class Catalog, class F>
constexpr bool visit_member(std::string_view name, F&& f) {
  return detail::catalog_of<Catalog>::visit(name, f);
}

/// The names of `Catalog`'s members joined by `separator` ("no|ddp|zero1"), for messages and --help.
template <class Catalog>
std::string joined_names(std::string_view separator) {
  std::string out;
  for (std::string_view name : catalog_names<Catalog>) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

/// The names of `Catalog`'s members whose facts satisfy `keep`, in catalog order, as a list for
/// messages: joined by `separator`, the last two by `last` ("zero1, zero2 or full_shard").
template <class Catalog, class Keep>
std::string names_where(Keep keep, std::string_view separator = ", ", std::string_view last = " or ") {
  std::vector<std::string_view> names;
  for_each_member<Catalog>([&]<class Tag>() {
    if (keep(Tag::facts)) names.push_back(Tag::facts.name);
  });
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? last : separator;
    out += names[i];
  }
  return out;
}

/// True when the schedule `name` (an --lr_scheduler_type) steps on an evaluation metric rather
/// than on the step count (its tag declares steps_on_metric: reduce_lr_on_plateau).
inline bool schedule_steps_on_metric(std::string_view name) {
  bool on_metric = false;
  visit_member<ScheduleCatalog>(name, [&]<class Tag>() {
    if constexpr (requires { Tag::steps_on_metric; }) on_metric = Tag::steps_on_metric;
  });
  return on_metric;
}

/// A string literal as a template argument (names_text's pieces).
template <std::size_t N>
struct FixedString {
  char chars[N]{};
  constexpr FixedString(const char (&text)[N]) {  // NOLINT: implicit, so "..." converts
    for (std::size_t i = 0; i < N; ++i) chars[i] = text[i];
  }
  [[nodiscard]] constexpr std::string_view view() const { return {chars, N - 1}; }
};

namespace detail {
template <class Catalog, FixedString Prefix, FixedString Separator, FixedString Suffix>
struct NamesText {
  static constexpr std::size_t length = [] {
    std::size_t n = Prefix.view().size() + Suffix.view().size();
    for (std::size_t i = 0; i < catalog_names<Catalog>.size(); ++i)
      n += catalog_names<Catalog>[i].size() + (i > 0 ? Separator.view().size() : 0);
    return n;
  }();
  static constexpr std::array<char, length + 1> chars = [] {
    std::array<char, length + 1> out{};
    std::size_t at = 0;
    auto put = [&](std::string_view text) {
      for (char c : text) out[at++] = c;
    };
    put(Prefix.view());
    for (std::size_t i = 0; i < catalog_names<Catalog>.size(); ++i) {
      if (i > 0) put(Separator.view());
      put(catalog_names<Catalog>[i]);
    }
    put(Suffix.view());
    return out;
  }();
};
}  // namespace detail

/// `Prefix`, `Catalog`'s names joined by `Separator`, then `Suffix`, as a compile-time string
/// (the --help text of a flag that chooses a member).
template <class Catalog, FixedString Prefix, FixedString Separator, FixedString Suffix>
inline constexpr std::string_view names_text{detail::NamesText<Catalog, Prefix, Separator, Suffix>::chars.data(),
                                             detail::NamesText<Catalog, Prefix, Separator, Suffix>::length};

}  // namespace loom
