// config/paths.hpp: a path a user hands over is checked with error codes, and each problem is
// one loom: line naming the path (a symlink loop, a file where a folder belongs and the other
// way round); the readers of user-given folders and files go through it.

#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/gpt2.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <filesystem>
#include <string>

namespace {

namespace fs = std::filesystem;
using loom::PathKind;
using loom_test::error_of;

}  // namespace

TEST_CASE("path_exists and check_path name loops and wrong kinds instead of throwing filesystem_error") {
  const auto dir = loom_test::fresh_dir("config/paths");
  const auto file = dir / "notes.txt";
  loom_test::write_bytes(file, "x");
  const auto loop = dir / "loop";
  fs::create_symlink(loop, loop);  // a link to itself: ELOOP on every status()

  CHECK(loom::path_exists(dir, PathKind::folder));
  CHECK(loom::path_exists(file, PathKind::file));
  CHECK_FALSE(loom::path_exists(dir / "missing", PathKind::file));
  CHECK_FALSE(loom::path_exists(file / "below_a_file", PathKind::folder));
  CHECK(error_of([&] { loom::check_path(dir / "missing", PathKind::folder, "a model folder"); }) ==
        "loom: " + (dir / "missing").string() + " does not exist (a model folder)");
  CHECK(error_of([&] { loom::check_path(file, PathKind::folder); }) ==
        "loom: " + file.string() + " is a file, not a folder");
  CHECK(error_of([&] { loom::check_path(dir, PathKind::file, "a settings file"); }) ==
        "loom: " + dir.string() + " is a folder, not a file (a settings file)");
  const std::string looped = "loom: " + loop.string() + " cannot be reached: too many levels of symbolic links "
                             "(a symlink loop)";
  CHECK(error_of([&] { (void)loom::path_exists(loop, PathKind::file); }) == looped);
  CHECK(error_of([&] { (void)loom::path_exists(loop / "config.json", PathKind::file); }).starts_with(
      "loom: " + (loop / "config.json").string() + " cannot be reached: too many levels"));
}

TEST_CASE("the readers of user-given paths report loops and wrong kinds as loom: lines") {
  const auto dir = loom_test::fresh_dir("config/path_readers");
  const auto file = dir / "notes.txt";
  loom_test::write_bytes(file, "x");
  const auto loop = dir / "loop";
  fs::create_symlink(loop, loop);
  const auto expect = [](const std::string& message, const std::string& want) {
    INFO(message);
    CHECK(message.starts_with("loom: "));
    CHECK(message.find(want) != std::string::npos);
  };

  // A settings or state file that is a folder, or a loop.
  expect(error_of([&] { (void)loom::json::read_file(dir); }), dir.string() + " is a folder, not a file");
  expect(error_of([&] { (void)loom::json::read_file(loop); }), "too many levels of symbolic links");
  // An HF model folder that is a file, a loop, or holds a loop for config.json.
  using loom::models::GPT2Config;
  expect(error_of([&] { (void)loom::models::read_hf_config<GPT2Config>(file); }),
         file.string() + " is a file, not a folder (an HF model folder holds config.json and model.safetensors)");
  expect(error_of([&] { (void)loom::models::read_hf_config<GPT2Config>(loop); }), "too many levels of symbolic links");
  const auto model = dir / "model";
  fs::create_directories(model);
  fs::create_symlink(model / "config.json", model / "config.json");
  expect(error_of([&] { (void)loom::models::read_hf_config<GPT2Config>(model); }),
         (model / "config.json").string() + " cannot be reached: too many levels of symbolic links");
  expect(error_of([&] { (void)loom::models::read_hf_weights(file); }), "is a file, not a folder");
  // Token files: a loop, a folder.
  expect(error_of([&] { loom::data::MappedFile m(loop); }), "too many levels of symbolic links");
  expect(error_of([&] { loom::data::MappedFile m(dir); }), dir.string() + " is a folder, not a file");
  expect(error_of([&] { (void)loom::data::read_token_meta(loop); }), "too many levels of symbolic links");
}
