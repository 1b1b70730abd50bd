#pragma once
// Callback events: one tag per HF event, and CallbackSet, which folds an event over the
// callback pack with `if constexpr (requires ...)` so an event nobody handles costs nothing,
// then calls the run-time callbacks (TrainerCallback, trainer_callback.hpp), if any.
// TrainerControl flags are reset here, exactly where HF's CallbackHandler resets them.

#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/log.hpp>
#include <loom/core/state.hpp>
#include <loom/trainer/trainer_callback.hpp>

#include <array>
#include <concepts>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

// Each event tag forwards to a callback's member of the same name, in the first form it
// accepts: (args, state, control, extra) for an event with an extra argument (metrics,
// logs); (args, state, control, const CallbackArgs&), HF's keyword arguments; or
// (args, state, control). A member with the event's name that fits no form is a compile
// error, not a silently skipped event.
#define LOOM_DEFINE_EVENT(NAME)                                                                         \
  struct NAME {                                                                                         \
    template <class Cb, class... X>                                                                     \
    static void call(Cb& cb, const TrainingArguments& a, TrainerState& s, TrainerControl& c,            \
                     const CallbackArgs& kw, const X&... x) {                                           \
      if constexpr (requires { cb.NAME(a, s, c, x...); }) {                                             \
        cb.NAME(a, s, c, x...);                                                                         \
      } else if constexpr (requires { cb.NAME(a, s, c, kw); }) {                                        \
        cb.NAME(a, s, c, kw);                                                                           \
      } else if constexpr (sizeof...(X) > 0 && requires { cb.NAME(a, s, c); }) {                        \
        cb.NAME(a, s, c);                                                                               \
      } else if constexpr (requires { &Cb::NAME; }) {                                                   \
        static_assert(dependent_false_v<Cb>,                                                            \
                      "loom: a callback's " #NAME " has the wrong signature; expected (const "          \
                      "loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&[, extra "   \
                      "or const loom::CallbackArgs&])");                                                \
      }                                                                                                 \
    }                                                                                                   \
    static void call_dynamic(TrainerCallback& cb, const TrainingArguments& a, TrainerState& s,          \
                             TrainerControl& c, const CallbackArgs& kw) {                               \
      cb.NAME(a, s, c, kw);                                                                             \
    }                                                                                                   \
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

/// The callbacks of one Trainer: the compiled ones (built-ins first, then the user's pack),
/// then the run-time ones in the order they were added. A compiled callback can be switched
/// off and on (remove_callback / add_callback of its type); run-time ones come and go.
template <class... Cbs>
class CallbackSet {
  static_assert((Callback<Cbs> && ...), "loom: every callback must be a class type with a default constructor "
                                        "(callbacks are configured through their members after construction)");

 public:
  /// True when `Cb` is one of the compiled callbacks.
  template <class Cb>
  static constexpr bool compiled = (std::is_same_v<Cb, Cbs> || ...);

  /// Fires `Event` on every enabled callback after applying HF's flag resets for it. `x`:
  /// the event's extra argument (on_evaluate / on_predict: metrics; on_log: logs), also
  /// handed over in the CallbackArgs.
  template <class Event, class... X>
  void fire(const TrainingArguments& a, TrainerState& s, TrainerControl& c, CallbackArgs kw, const X&... x) {
    if constexpr (std::is_same_v<Event, event::on_train_begin>) c.should_training_stop = false;
    if constexpr (std::is_same_v<Event, event::on_epoch_begin>) c.should_epoch_stop = false;
    if constexpr (std::is_same_v<Event, event::on_step_begin>)
      c.should_log = c.should_evaluate = c.should_save = false;
    if constexpr (std::is_same_v<Event, event::on_log>) c.should_log = false;
    if constexpr (std::is_same_v<Event, event::on_evaluate>) c.should_evaluate = false;
    if constexpr (std::is_same_v<Event, event::on_save>) c.should_save = false;
    if constexpr (sizeof...(X) == 1) {
      if constexpr (std::is_same_v<Event, event::on_log>) kw.logs = &(x, ...);
      else kw.metrics = &(x, ...);
    }
    std::size_t i = 0;
    std::apply([&](auto&... cb) { ((enabled_[i++] ? Event::call(cb, a, s, c, kw, x...) : void()), ...); },
               callbacks_);
    // By index: a callback may add or remove callbacks while the event runs.
    for (std::size_t k = 0; k < dynamic_.size(); ++k) {
      const std::shared_ptr<TrainerCallback> cb = dynamic_[k];
      Event::call_dynamic(*cb, a, s, c, kw);
    }
  }

  /// Calls `f(cb)` on every compiled callback, in order.
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
    for (const auto& cb : dynamic_)
      if (const auto name = cb->state_name(); !name.empty()) states[name] = cb->state();
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
    for (const auto& cb : dynamic_)
      if (const auto name = cb->state_name(); !name.empty() && states.contains(name))
        cb->load_state(nlohmann::json(states[name]));
  }

  /// The compiled callback of type `Cb`.
  template <class Cb>
  Cb& get() {
    return std::get<Cb>(callbacks_);
  }

  /// Switches the compiled callback `Cb` on or off.
  template <class Cb>
  void enable(bool on) {
    static_assert(compiled<Cb>, "loom: enable<Cb>: Cb is not one of the Trainer's compiled callbacks");
    std::size_t i = 0;
    ((std::is_same_v<Cb, Cbs> ? (enabled_[i] = on, ++i) : ++i), ...);
  }
  /// True when the compiled callback `Cb` is on.
  template <class Cb>
  [[nodiscard]] bool enabled() const {
    static_assert(compiled<Cb>, "loom: enabled<Cb>: Cb is not one of the Trainer's compiled callbacks");
    std::size_t i = 0, at = 0;
    ((std::is_same_v<Cb, Cbs> ? (at = i++) : i++), ...);
    return enabled_[at];
  }

  /// Appends a run-time callback. Like HF, adding a second callback of a type already there
  /// prints a warning (both are kept).
  void add(std::shared_ptr<TrainerCallback> cb) {
    if (!cb) return;
    const TrainerCallback& added = *cb;
    for (const auto& d : dynamic_) {
      const TrainerCallback& present = *d;
      if (typeid(present) == typeid(added))
        log_message(LogLevel::warning, "adding a second callback of the same type ({}); both will be called",
                    typeid(added).name());
    }
    dynamic_.push_back(std::move(cb));
  }
  /// Removes and returns the first run-time callback for which `pred` holds (null: none).
  template <class Pred>
  std::shared_ptr<TrainerCallback> pop_if(Pred&& pred) {
    for (auto it = dynamic_.begin(); it != dynamic_.end(); ++it)
      if (pred(*it)) {
        auto cb = *it;
        dynamic_.erase(it);
        return cb;
      }
    return nullptr;
  }
  /// The run-time callbacks, in call order.
  [[nodiscard]] const std::vector<std::shared_ptr<TrainerCallback>>& dynamic() const { return dynamic_; }

 private:
  std::tuple<Cbs...> callbacks_;
  std::array<bool, sizeof...(Cbs)> enabled_ = [] {
    std::array<bool, sizeof...(Cbs)> a{};
    a.fill(true);
    return a;
  }();
  std::vector<std::shared_ptr<TrainerCallback>> dynamic_;
};

}  // namespace loom
