#pragma once
// Definitions of distributed/env.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/distributed/env.hpp>

#include <charconv>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace loom::dist {

namespace detail {
LOOM_INLINE int parse_env_int(std::string_view name, const char* text, int min, int max) {
  const std::string_view s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  check(ec == std::errc() && end == s.data() + s.size() && !s.empty(),
        "environment variable {}={:?} is not an integer", name, s);
  check(value >= min && value <= max, "environment variable {}={} is out of range [{}, {}]", name, value, min, max);
  return value;
}
}  // namespace detail

LOOM_INLINE World world_from_env(const std::function<const char*(const char*)>& getenv) {
  constexpr const char* required[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> present, missing;
  for (const char* n : required) (getenv(n) != nullptr ? present : missing).emplace_back(n);
  World w;
  if (present.empty()) return w;
  if (!missing.empty()) {
    std::string have, lack;
    for (const auto& n : present) have += (have.empty() ? "" : ", ") + n;
    for (const auto& n : missing) lack += (lack.empty() ? "" : ", ") + n;
    fail("the launch environment is incomplete: {} set but {} missing; start the program with torchrun, "
         "or set all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or none for one process)",
         have, lack);
  }
  w.launched = true;
  w.size = detail::parse_env_int("WORLD_SIZE", getenv("WORLD_SIZE"), 1, 1 << 20);
  w.rank = detail::parse_env_int("RANK", getenv("RANK"), 0, w.size - 1);
  w.local_size = getenv("LOCAL_WORLD_SIZE") ? detail::parse_env_int("LOCAL_WORLD_SIZE", getenv("LOCAL_WORLD_SIZE"),
                                                                       1, w.size)
                                            : w.size;
  w.local_rank = detail::parse_env_int("LOCAL_RANK", getenv("LOCAL_RANK"), 0, w.local_size - 1);
  check(w.local_rank <= w.rank, "environment variables LOCAL_RANK={} and RANK={} contradict each other",
        w.local_rank, w.rank);
  w.master_addr = getenv("MASTER_ADDR");
  check(!w.master_addr.empty(), "environment variable MASTER_ADDR is empty");
  w.master_port = detail::parse_env_int("MASTER_PORT", getenv("MASTER_PORT"), 1, 65535);
  if (const char* a = getenv("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string_view v(a);
    check(v == "True" || v == "False", "environment variable TORCHELASTIC_USE_AGENT_STORE={:?} is not True or False", v);
    w.agent_store = v == "True";
  }
  if (const char* r = getenv("TORCHELASTIC_RESTART_COUNT"))
    w.restart_count = detail::parse_env_int("TORCHELASTIC_RESTART_COUNT", r, 0, 1 << 20);
  return w;
}

}  // namespace loom::dist
