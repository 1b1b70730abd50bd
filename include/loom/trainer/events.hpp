#pragma once
// Callback events: one tag per HF event, and CallbackSet, which folds an event over the
// callback pack with `if constexpr (requires ...)` so an event nobody handles costs nothing.
// TrainerControl flags are reset here, exactly where HF's CallbackHandler resets them.

#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>

#include <concepts>
#include <string>
#include <tuple>
#include <type_traits>

namespace loom {

// Each event tag forwards to a callback's member of the same name. A callback may take the
// event's extra argument (metrics, logs) or not. A member with the event's name that fits
// neither form is a compile error, not a silently skipped event.
#define LOOM_DEFINE_EVENT(NAME)                                                                        \
  struct NAME {                                                                                        \
    template <class Cb, class... X>                                                                    \
    static void call(Cb& cb, const TrainingArguments& a, TrainerState& s, TrainerControl& c,           \
                     const X&... x) {                                                                  \
      if constexpr (requires { cb.NAME(a, s, c, x...); }) {                                            \
        cb.NAME(a, s, c, x...);                                                                        \
      } else if constexpr (sizeof...(X) > 0 && requires { cb.NAME(a, s, c); }) {                       \
        cb.NAME(a, s, c);                                                                              \
      } else if constexpr (requires { &Cb::NAME; }) {                                                  \
        static_assert(dependent_false_v<Cb>,                                                           \
                      "loom: a callback's " #NAME " has the wrong signature; expected (const "         \
                      "loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&[, extra])"); \
      }                                                                                                \
    }                                                                                                  \
  };

/// HF's callback events, in the order a training run fires them.
namespace event {
LOOM_DEFINE_EVENT(on_init_end)
LOOM_DEFINE_EVENT(on_train_begin)
LOOM_DEFINE_EVENT(on_epoch_begin)
LOOM_DEFINE_EVENT(on_step_begin)
LOOM_DEFINE_EVENT(on_substep_end)
LOOM_DEFINE_EVENT(on_pre_optimizer_step)
LOOM_DEFINE_EVENT(on_optimizer_step)
LOOM_DEFINE_EVENT(on_step_end)
LOOM_DEFINE_EVENT(on_epoch_end)
LOOM_DEFINE_EVENT(on_train_end)
LOOM_DEFINE_EVENT(on_evaluate)
LOOM_DEFINE_EVENT(on_predict)
LOOM_DEFINE_EVENT(on_prediction_step)
LOOM_DEFINE_EVENT(on_save)
LOOM_DEFINE_EVENT(on_log)
}  // namespace event
#undef LOOM_DEFINE_EVENT

/// What a callback is: a class the Trainer can default-construct. Its event members are
/// checked where they are called (a member named like an event with the wrong parameters is
/// a compile error); `name` + `state()` + `load_state(json)` make it stateful (checkpointed).
template <class Cb>
concept Callback = std::is_class_v<Cb> && std::default_initializable<Cb>;

/// A callback whose state is checkpointed in trainer_state.json under its `name`.
template <class Cb>
concept StatefulCallback = Callback<Cb> && requires(Cb& cb, const nlohmann::json& j) {
  { Cb::name } -> std::convertible_to<std::string_view>;
  cb.state();
  cb.load_state(j);
};

/// The callbacks of one Trainer: built-ins first, then the user's pack, called in that order.
template <class... Cbs>
class CallbackSet {
  static_assert((Callback<Cbs> && ...), "loom: every callback must be a class type with a default constructor "
                                        "(callbacks are configured through their members after construction)");

 public:
  /// Fires `Event` on every callback after applying HF's flag resets for it.
  template <class Event, class... X>
  void fire(const TrainingArguments& a, TrainerState& s, TrainerControl& c, const X&... x) {
    if constexpr (std::is_same_v<Event, event::on_train_begin>) c.should_training_stop = false;
    if constexpr (std::is_same_v<Event, event::on_epoch_begin>) c.should_epoch_stop = false;
    if constexpr (std::is_same_v<Event, event::on_step_begin>)
      c.should_log = c.should_evaluate = c.should_save = false;
    if constexpr (std::is_same_v<Event, event::on_log>) c.should_log = false;
    if constexpr (std::is_same_v<Event, event::on_evaluate>) c.should_evaluate = false;
    if constexpr (std::is_same_v<Event, event::on_save>) c.should_save = false;
    std::apply([&](auto&... cb) { (Event::call(cb, a, s, c, x...), ...); }, callbacks_);
  }

  /// Calls `f(cb)` on every callback, in order.
  template <class F>
  void for_each(F&& f) {
    std::apply([&](auto&... cb) { (f(cb), ...); }, callbacks_);
  }

  /// Stores the state of every stateful callback in `states` under its name.
  void save_states(nlohmann::ordered_json& states) {
    for_each([&](auto& cb) {
      using Cb = std::decay_t<decltype(cb)>;
      if constexpr (StatefulCallback<Cb>) states[std::string(Cb::name)] = cb.state();
    });
  }
  /// Restores every stateful callback found in `states`.
  void load_states(const nlohmann::ordered_json& states) {
    for_each([&](auto& cb) {
      using Cb = std::decay_t<decltype(cb)>;
      if constexpr (StatefulCallback<Cb>) {
        const std::string key(Cb::name);
        if (states.contains(key)) cb.load_state(nlohmann::json(states[key]));
      }
    });
  }

  /// The callback of type `Cb`.
  template <class Cb>
  Cb& get() {
    return std::get<Cb>(callbacks_);
  }

 private:
  std::tuple<Cbs...> callbacks_;
};

}  // namespace loom
