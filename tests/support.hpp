#pragma once
// Helpers shared by loom's test files: a free port, shell capture, the Python peer, scratch folders,
// file bytes, loom::Error messages. Light on purpose (no Trainer); the training set-up
// shared by the Trainer-level tests is in trainer_support.hpp. Everything here is inline:
// the unit tests are one executable.

#include <loom/config/error.hpp>

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom_test {

/// A TCP port on the loopback interface that was free a moment ago (for MASTER_PORT).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(s);
  return ntohs(addr.sin_port);
}

/// Runs `cmd` through the shell and returns what it printed on stdout.
inline std::string run_capture(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), &pclose);
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe.get())) out += buf;
  return out;
}

/// The Python of $LOOM_PYTHON; nullptr (after a MESSAGE that `check` is skipped) when it
/// is unset or missing.
inline const char* python(std::string_view check) {
  const char* py = std::getenv("LOOM_PYTHON");
  if (py != nullptr && std::filesystem::exists(py)) return py;
  MESSAGE("LOOM_PYTHON not set: " << check << " skipped");
  return nullptr;
}

/// Where the tests find the source tree and their scratch root. Read at run time, not
/// compiled in, so that the test objects do not depend on the checkout's path and ccache
/// serves them to a clone elsewhere: $LOOM_SOURCE_DIR / $LOOM_TEST_TMP when set, else the
/// `loom_test_paths.txt` that CMake writes beside the test executables.
struct TestPaths {
  std::filesystem::path source_dir;  ///< the checkout (holds include/, tests/)
  std::filesystem::path tmp_root;    ///< scratch folders live below it
};

inline const TestPaths& test_paths() {
  static const TestPaths paths = [] {
    TestPaths p;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe");
    std::ifstream in(exe.parent_path() / "loom_test_paths.txt");
    for (std::string line; std::getline(in, line);) {
      const auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
      if (key == "source_dir") p.source_dir = value;
      if (key == "tmp_dir") p.tmp_root = value;
    }
    if (const char* s = std::getenv("LOOM_SOURCE_DIR"); s != nullptr && *s != '\0') p.source_dir = s;
    if (const char* t = std::getenv("LOOM_TEST_TMP"); t != nullptr && *t != '\0') p.tmp_root = t;
    if (p.source_dir.empty() || p.tmp_root.empty())
      throw std::runtime_error("loom tests: no " + (exe.parent_path() / "loom_test_paths.txt").string() +
                               " and LOOM_SOURCE_DIR / LOOM_TEST_TMP unset: run the tests from the build folder");
    return p;
  }();
  return paths;
}

/// The checkout's root.
inline const std::filesystem::path& source_dir() { return test_paths().source_dir; }

/// The root of the tests' scratch folders.
inline const std::filesystem::path& tmp_root() { return test_paths().tmp_root; }

/// <tmp_root()>/<name> ("area/case" nests), removed if it exists, not created.
inline std::filesystem::path tmp_dir(const std::string& name) {
  auto p = tmp_root() / name;
  std::filesystem::remove_all(p);
  return p;
}

/// tmp_dir(name), created empty.
inline std::filesystem::path fresh_dir(const std::string& name) {
  auto p = tmp_dir(name);
  std::filesystem::create_directories(p);
  return p;
}

/// The whole content of the file at `path` ("" when it cannot be read).
inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Replaces the file at `path` with `bytes`.
inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The message of the loom::Error that `f()` throws, or "<no loom::Error>".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "<no loom::Error>";
}

}  // namespace loom_test
