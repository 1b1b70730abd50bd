#pragma once
// PolicyBundle<Ps...>: sorts the policy tags a Trainer names into families, fills in the
// default of every family not named, and rejects a family named twice or a type that is
// no policy at all, each with a "loom:" static_assert.

#include <loom/policy/tags.hpp>

#include <type_traits>

namespace loom {

/// A type that declares which policy family it belongs to.
template <class T>
concept Policy = requires { typename T::loom_family; } &&
                 (std::is_same_v<typename T::loom_family, family::Sharding> ||
                  std::is_same_v<typename T::loom_family, family::Precision> ||
                  std::is_same_v<typename T::loom_family, family::Schedule> ||
                  std::is_same_v<typename T::loom_family, family::Callbacks>);

namespace detail {

template <class T>
struct check_policy {
  static_assert(Policy<T>,
                "loom: a Trainer argument after Model is not a loom policy; expected a tag "
                "from loom::sharding, loom::precision, loom::schedule, or loom::Callbacks<...>");
  static constexpr bool value = Policy<T>;
};

template <class Family, class T>
constexpr bool in_family() {
  if constexpr (Policy<T>) return std::is_same_v<typename T::loom_family, Family>;
  else return false;
}

template <class Family, class... Ps>
constexpr int count_family = (0 + ... + (in_family<Family, Ps>() ? 1 : 0));

template <class Family, class Default, class... Ps>
struct pick {
  using type = Default;
};
template <class Family, class Default, class P, class... Ps>
struct pick<Family, Default, P, Ps...> {
  using type = std::conditional_t<in_family<Family, P>(), P,
                                  typename pick<Family, Default, Ps...>::type>;
};

}  // namespace detail

/// The resolved policies of one Trainer instantiation.
template <class... Ps>
struct PolicyBundle {
  static_assert((detail::check_policy<Ps>::value && ...));
  static_assert(detail::count_family<family::Sharding, Ps...> <= 1,
                "loom: the sharding policy family is named twice; keep one of them");
  static_assert(detail::count_family<family::Precision, Ps...> <= 1,
                "loom: the precision policy family is named twice; keep one of them");
  static_assert(detail::count_family<family::Schedule, Ps...> <= 1,
                "loom: the schedule policy family is named twice; keep one of them");
  static_assert(detail::count_family<family::Callbacks, Ps...> <= 1,
                "loom: loom::Callbacks<...> is named twice; put every callback in one pack");

  using sharding = typename detail::pick<family::Sharding, sharding::NoShard, Ps...>::type;
  using precision = typename detail::pick<family::Precision, precision::FP32, Ps...>::type;
  using schedule = typename detail::pick<family::Schedule, schedule::FromArgs, Ps...>::type;
  using callbacks = typename detail::pick<family::Callbacks, Callbacks<>, Ps...>::type;
};

}  // namespace loom
