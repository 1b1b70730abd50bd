#pragma once
// Helpers shared by loom's test files.

#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <string>

namespace loom_test {

/// Runs `cmd` through the shell and returns what it printed on stdout.
inline std::string run_capture(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), &pclose);
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe.get())) out += buf;
  return out;
}

}  // namespace loom_test
