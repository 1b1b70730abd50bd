#pragma once
// The world a process belongs to, read from the variables torchrun (torch.distributed.run)
// sets for every worker: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, and TORCHELASTIC_USE_AGENT_STORE / TORCHELASTIC_RESTART_COUNT when the
// elastic agent hosts the rendezvous store. None of them set means one process; some of
// them set, or values that contradict each other, are a loom::Error naming the variable.

#include <loom/config/inline.hpp>
#include <loom/core/error.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

namespace loom::dist {

/// Where this process sits among all processes of the job.
struct World {
  int rank = 0;                ///< global rank, 0 .. size-1
  int size = 1;                ///< number of processes
  int local_rank = 0;          ///< rank on this node (selects the GPU)
  int local_size = 1;          ///< processes on this node
  std::string master_addr;     ///< rendezvous store host
  int master_port = 0;         ///< rendezvous store port
  bool agent_store = false;    ///< torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True)
  int restart_count = 0;       ///< TORCHELASTIC_RESTART_COUNT (the store prefix /worker/attempt_<n>)
  bool launched = false;       ///< the variables were present (a launcher started us)
  [[nodiscard]] bool is_main() const { return rank == 0; }
  [[nodiscard]] bool is_local_main() const { return local_rank == 0; }
  /// The job spans several nodes (torchrun's --nnodes > 1: fewer processes here than in all).
  [[nodiscard]] bool several_nodes() const { return local_size < size; }
  /// Whether this process logs at --log_level (HF's TrainingArguments.should_log): the local
  /// main process of each node with log_on_each_node, else global rank 0 alone.
  [[nodiscard]] bool logs(bool log_on_each_node) const { return log_on_each_node ? is_local_main() : is_main(); }
};

namespace detail {
/// `text` (the value of environment variable `name`) as an int in [min, max]; else loom::Error.
LOOM_INLINE int parse_env_int(std::string_view name, const char* text, int min, int max);
}  // namespace detail

/// The world described by the environment; `getenv` is replaceable for tests.
LOOM_INLINE World world_from_env(const std::function<const char*(const char*)>& getenv =
                                     [](const char* n) { return std::getenv(n); });

}  // namespace loom::dist

#if defined(LOOM_HEADER_ONLY)
#include <loom/distributed/impl/env.ipp>
#endif
