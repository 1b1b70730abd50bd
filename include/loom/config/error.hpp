#pragma once
// The one exception type of loom. Every message starts with "loom: " so users can grep it.
// It lives in config/ (the bottom layer) because argument parsing is the first thing that
// can fail; core/error.hpp re-exports it for the layers above.

#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

/// Thrown for every user-facing mistake found at run time; what() starts with "loom: ".
class Error : public std::runtime_error {
 public:
  /// Wraps `message`, adding the "loom: " prefix unless it is already there.
  explicit Error(std::string_view message)
      : std::runtime_error(with_prefix(message)) {}

 private:
  static std::string with_prefix(std::string_view message) {
    constexpr std::string_view prefix = "loom: ";
    if (message.substr(0, prefix.size()) == prefix) return std::string(message);
    return std::string(prefix) + std::string(message);
  }
};

}  // namespace loom
