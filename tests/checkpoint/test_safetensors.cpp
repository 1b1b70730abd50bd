// safetensors: byte layout, round trip of every dtype, cross-checks against Python's
// safetensors in both directions, every malformed-file error, and module save/load.
#include <loom/checkpoint/safetensors.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using loom::checkpoint::load_safetensors;
using loom::checkpoint::load_safetensors_metadata;
using loom::checkpoint::save_safetensors;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

using loom_test::error_of;
using loom_test::read_bytes;
using loom_test::write_bytes;
using loom_test::run_capture;

fs::path safetensors_dir(const std::string& name) { return loom_test::fresh_dir("checkpoint_safetensors/" + name); }

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (auto& c : s) c = static_cast<char>(n & 0xff), n >>= 8;
  return s;
}

// A safetensors file with the given header text (unpadded) and data bytes.
std::string file_with(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

std::map<std::string, torch::Tensor> as_map(const Named& v) {
  std::map<std::string, torch::Tensor> m;
  for (const auto& [k, t] : v) m.emplace(k, t);
  return m;
}

// One tensor of every supported dtype, plus 0-dim, empty and non-contiguous inputs.
Named every_dtype() {
  torch::manual_seed(3);
  auto base = torch::randn({4, 6}, torch::kFloat64) * 100;
  return {
      {"f64", base.clone()},
      {"f32", base.to(torch::kFloat32)},
      {"f16", base.to(torch::kFloat16)},
      {"bf16", base.to(torch::kBFloat16)},
      {"i64", torch::tensor({std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                             std::numeric_limits<int64_t>::max()})},
      {"i32", torch::tensor({std::numeric_limits<int32_t>::min(), -7, 0, std::numeric_limits<int32_t>::max()})},
      {"i16", torch::arange(-300, 300, 37, torch::kInt16)},
      {"i8", torch::arange(-128, 128, 5, torch::kInt32).to(torch::kInt8)},
      {"u8", torch::arange(0, 256, 3, torch::kInt32).to(torch::kUInt8)},
      {"bool", torch::tensor({true, false, false, true, true})},
      {"scalar", torch::tensor(2.5f)},
      {"scalar_i64", torch::tensor(int64_t{-42})},
      {"empty", torch::zeros({0, 3})},
      {"empty_bf16", torch::zeros({2, 0}, torch::kBFloat16)},
      {"transposed", base.to(torch::kFloat32).t()},
      {"strided", torch::arange(20, torch::kInt64).view({4, 5}).slice(1, 0, 5, 2)},
      {"expanded", torch::tensor({1.f, 2.f}).unsqueeze(0).expand({3, 2})},
  };
}

// Compares a tensor with Python's description {dtype, shape, values (flattened)}.
void check_against_python(const std::string& name, const torch::Tensor& t, const nlohmann::json& py) {
  INFO("tensor " << name);
  static const std::map<std::string, torch::ScalarType> dtypes{
      {"torch.float64", torch::kFloat64}, {"torch.float32", torch::kFloat32}, {"torch.float16", torch::kFloat16},
      {"torch.bfloat16", torch::kBFloat16}, {"torch.int64", torch::kInt64}, {"torch.int32", torch::kInt32},
      {"torch.int16", torch::kInt16},     {"torch.int8", torch::kInt8},       {"torch.uint8", torch::kUInt8},
      {"torch.bool", torch::kBool}};
  REQUIRE(dtypes.count(py.at("dtype").get<std::string>()) == 1);
  CHECK_MESSAGE((t.scalar_type() == dtypes.at(py.at("dtype").get<std::string>())), "dtype differs");
  CHECK(t.sizes().vec() == py.at("shape").get<std::vector<int64_t>>());
  const auto& values = py.at("values");
  auto flat = t.contiguous().view({-1});
  REQUIRE(static_cast<int64_t>(values.size()) == flat.numel());
  if (t.is_floating_point()) {
    auto d = flat.to(torch::kFloat64);
    for (int64_t i = 0; i < flat.numel(); ++i) CHECK(d[i].item<double>() == values[static_cast<size_t>(i)].get<double>());
  } else {
    auto l = flat.to(torch::kInt64);
    for (int64_t i = 0; i < flat.numel(); ++i)
      CHECK(l[i].item<int64_t>() == values[static_cast<size_t>(i)].get<int64_t>());
  }
}

const char* kPythonDescribe = R"(
def describe(tensors):
    out = {}
    for k, t in tensors.items():
        flat = t.reshape(-1)
        vals = flat.double().tolist() if t.is_floating_point() else flat.long().tolist()
        out[k] = {"dtype": str(t.dtype), "shape": list(t.shape), "values": vals}
    return out
)";

struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::Tensor running;
  Net() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})));
    running = register_buffer("running", torch::zeros({3}));
  }
};

void randomize(Net& net, int64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard g;
  for (auto& p : net.parameters()) p.copy_(torch::randn_like(p));
  net.running.copy_(torch::randn({3}));
}
TEST_CASE("a tensor whose memory a FullShard rank released is refused by name, not written as a disk error") {
  const auto dir = loom_test::fresh_dir("checkpoint/released");
  auto weight = torch::randn({4, 3});
  auto view = weight.view({12});
  // What the FullShard engine does to a gathered unit after its forward (engine_common.hpp).
  auto* storage = weight.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, weight.device()));
  storage->set_nbytes(0);
  const auto error = error_of([&] { save_safetensors({{"w", view}}, dir / "w.safetensors"); });
  CHECK(error.starts_with("loom: cannot save " + (dir / "w.safetensors").string() + ": tensor 'w' holds no data here"));
  CHECK(error.find("save through Trainer::save_model or Accelerator::save_model") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "w.safetensors.tmp"));
}

}  // namespace

TEST_CASE("safetensors: the byte layout is the format's (length, padded JSON header, little-endian data)") {
  const auto dir = safetensors_dir("layout");
  const auto path = dir / "a.safetensors";
  save_safetensors({{"b", torch::tensor({1.0f, -2.0f})}, {"a", torch::tensor({int64_t{1}})},
                    {"c", torch::tensor({int16_t{258}})}},
                   path);
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  CHECK(n % 8 == 0);
  REQUIRE(bytes.size() == 8 + n + 8 + 8 + 2);
  std::string header = bytes.substr(8, n);
  // Largest elements first, then by name (the Python library's layout); spaces pad the header.
  const std::string expected =
      R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("c":{"dtype":"I16","shape":[1],"data_offsets":[16,18]}})";
  CHECK(header.substr(0, expected.size()) == expected);
  CHECK(header.find_first_not_of(' ', expected.size()) == std::string::npos);
  const std::string data = bytes.substr(8 + n);
  CHECK(data == std::string("\x01\0\0\0\0\0\0\0", 8) + std::string("\0\0\x80\x3f\0\0\0\xc0", 8) +
                    std::string("\x02\x01", 2));
  CHECK_FALSE(fs::exists(dir / "a.safetensors.tmp"));
  // No tensors at all is still a valid file.
  save_safetensors({}, dir / "none.safetensors");
  CHECK(load_safetensors(dir / "none.safetensors").empty());
  CHECK(read_bytes(dir / "none.safetensors") == le64(8) + "{}      ");
}

TEST_CASE("safetensors: every dtype, 0-dim, empty and non-contiguous tensors round-trip exactly") {
  const auto dir = safetensors_dir("roundtrip");
  const auto input = every_dtype();
  save_safetensors(input, dir / "all.safetensors");
  const auto loaded = load_safetensors(dir / "all.safetensors");
  REQUIRE(loaded.size() == input.size());
  const auto got = as_map(loaded);
  for (const auto& [name, t] : input) {
    INFO("tensor " << name);
    REQUIRE(got.count(name) == 1);
    const auto& l = got.at(name);
    CHECK_MESSAGE((l.scalar_type() == t.scalar_type()), "dtype differs");
    CHECK(l.sizes() == t.sizes());
    CHECK(l.device().is_cpu());
    CHECK(torch::equal(l, t));
  }
  CHECK(got.at("scalar").dim() == 0);
  CHECK(got.at("scalar").item<float>() == 2.5f);
  CHECK(got.at("strided").sizes() == torch::IntArrayRef{4, 3});
  CHECK(got.at("strided")[1][2].item<int64_t>() == 9);
  // Header order: by element size (8, 4, 2, 1 bytes), then name.
  std::vector<std::string> order;
  for (const auto& [name, t] : loaded) order.push_back(name);
  CHECK(order.front() == "f64");
  CHECK(order.back() == "u8");
}

TEST_CASE("safetensors: tensors that require grad or live on the GPU are saved from a CPU copy") {
  const auto dir = safetensors_dir("grad_device");
  auto w = torch::randn({3, 2}, torch::requires_grad());
  Named input{{"w", w}};
  if (torch::cuda::is_available()) input.emplace_back("gpu", torch::arange(6, torch::kFloat32).cuda().view({2, 3}).t());
  save_safetensors(input, dir / "g.safetensors");
  const auto got = as_map(load_safetensors(dir / "g.safetensors"));
  CHECK(torch::equal(got.at("w"), w.detach()));
  CHECK_FALSE(got.at("w").requires_grad());
  if (torch::cuda::is_available()) CHECK(torch::equal(got.at("gpu"), input[1].second.cpu()));
  else MESSAGE("no CUDA device: GPU tensor save not exercised");
}

TEST_CASE("safetensors: metadata round-trips; a file without metadata has none") {
  const auto dir = safetensors_dir("metadata");
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\" \\ {}"}, {"empty", ""}};
  save_safetensors({{"x", torch::ones({2})}}, dir / "m.safetensors", meta);
  CHECK(load_safetensors_metadata(dir / "m.safetensors") == meta);
  CHECK(load_safetensors(dir / "m.safetensors").size() == 1);  // __metadata__ is no tensor
  save_safetensors({{"x", torch::ones({2})}}, dir / "plain.safetensors");
  CHECK(load_safetensors_metadata(dir / "plain.safetensors").empty());
  CHECK(read_bytes(dir / "plain.safetensors").find("__metadata__") == std::string::npos);
}

TEST_CASE("safetensors: the writer rejects duplicate names, unsupported dtypes and undefined tensors") {
  const auto dir = safetensors_dir("writer_errors");
  const auto path = dir / "w.safetensors";
  CHECK(error_of([&] { save_safetensors({{"a", torch::ones({1})}, {"a", torch::zeros({1})}}, path); }) ==
        "loom: cannot save " + path.string() + ": the tensor name 'a' appears twice");
  CHECK(error_of([&] { save_safetensors({{"z", torch::ones({1}, torch::kComplexFloat)}}, path); })
            .find("tensor 'z' has dtype ComplexFloat") != std::string::npos);
  CHECK(error_of([&] { save_safetensors({{"u", torch::Tensor()}}, path); }) ==
        "loom: cannot save " + path.string() + ": tensor 'u' is undefined");
  CHECK(error_of([&] { save_safetensors({{"__metadata__", torch::ones({1})}}, path); }).find("reserved") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(dir / "w.safetensors.tmp"));
  // A failed save leaves an existing file untouched.
  save_safetensors({{"keep", torch::ones({2})}}, path);
  CHECK_THROWS_AS(save_safetensors({{"a", torch::ones({1})}, {"a", torch::ones({1})}}, path), loom::Error);
  CHECK(as_map(load_safetensors(path)).count("keep") == 1);
}

TEST_CASE("safetensors: every malformed file is a loom::Error naming the file") {
  const auto dir = safetensors_dir("malformed");
  auto err = [&](const std::string& name, const std::string& bytes) {
    const auto p = dir / name;
    write_bytes(p, bytes);
    const auto msg = error_of([&] { (void)load_safetensors(p); });
    INFO("file " << name << ": " << msg);
    CHECK(msg.rfind("loom: ", 0) == 0);
    CHECK(msg.find(p.string()) != std::string::npos);
    // The metadata reader checks the same header.
    CHECK(error_of([&] { (void)load_safetensors_metadata(p); }) == msg);
    return msg;
  };
  auto has = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  const auto missing = dir / "missing.safetensors";
  CHECK(error_of([&] { (void)load_safetensors(missing); }) ==
        "loom: safetensors file " + missing.string() + " does not exist");
  has(err("empty", ""), "fewer than the 8-byte header length");
  has(err("short", std::string("\x10\0\0", 3)), "it has 3 bytes, fewer than the 8-byte header length");
  has(err("long_header", le64(1000) + "{}"), "the header length 1000 exceeds the 2 bytes after it");
  has(err("huge_header", std::string(8, '\xff') + "{}"), "exceeds");
  has(err("bad_json", file_with("{\"a\": {", "")), "the header is not valid JSON");
  has(err("binary_json", file_with(std::string("\0\1\2\3", 4), "")), "the header is not valid JSON");
  has(err("array", file_with("[1, 2]", "")), "the header is not a JSON object");
  has(err("entry_not_object", file_with(R"({"a": 3})", "")), "tensor 'a' is not described by a JSON object");
  has(err("no_dtype", file_with(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0'))),
      "tensor 'a' has no dtype");
  has(err("bad_dtype", file_with(R"({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", "x")),
      "tensor 'a' has unsupported dtype 'F8_E4M3'");
  has(err("no_shape", file_with(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", std::string(4, '\0'))),
      "tensor 'a' has no shape");
  has(err("negative_shape",
          file_with(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", std::string(4, '\0'))),
      "not a list of non-negative integers");
  has(err("no_offsets", file_with(R"({"a": {"dtype": "F32", "shape": [1]}})", std::string(4, '\0'))),
      "tensor 'a' has no data_offsets");
  has(err("offsets_size", file_with(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 7]}})",
                                    std::string(8, '\0'))),
      "tensor 'a' has data_offsets [0, 7] (7 bytes) but shape [2] of F32 needs 8 bytes");
  has(err("offsets_outside", file_with(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                                       std::string(4, '\0'))),
      "tensor 'a' has data_offsets [0, 8] outside the 4 bytes of data");
  has(err("offsets_reversed", file_with(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 2]}})",
                                        std::string(4, '\0'))),
      "data_offsets [4, 2] outside");
  has(err("overflowing_shape",
          file_with(R"({"a": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
                    std::string(8, '\0'))),
      "needs more than 2^64 bytes");
  has(err("bad_metadata", file_with(R"({"__metadata__": {"k": 1}})", "")), "__metadata__ entry 'k' is not a string");


  // Strict as the reference reader: the tensors tile the data exactly, and the header is
  // one JSON object with unique names, padded with spaces only.
  const std::string two_u8 = R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, )";
  has(err("gap", file_with(two_u8 + R"("b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})",
                           std::string("\x01\x02..\x03\x04", 6))),
      "is corrupt: tensor 'b' has data_offsets [4, 6] but the previous tensor 'a' ends at 2");
  has(err("overlap", file_with(two_u8 + R"("b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})",
                               std::string("\x01\x02\x03", 3))),
      "tensor 'b' has data_offsets [1, 3] but the previous tensor 'a' ends at 2");
  has(err("not_from_0", file_with(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})", "xyz")),
      "tensor 'a' has data_offsets [1, 3] but the data starts at 0");
  has(err("trailing", file_with(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "xyz")),
      "its tensors cover 2 bytes of data but the file holds 3");
  has(err("duplicate", file_with(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, )"
                                 R"("a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})", "xy")),
      "(header): key 'a' appears twice in the top-level object");
  has(err("leading_space", file_with(R"( {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", "x")),
      "the header does not start with '{'");
  has(err("newline_padding", file_with(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})"
                                       "\n",
                                       "x")),
      "bytes other than space padding");
  {
    const auto big = dir / "header_too_large";  // sparse: the length is refused before anything is read
    write_bytes(big, le64(100'000'001) + "{");
    std::filesystem::resize_file(big, 8 + 100'000'001);
    has(error_of([&] { (void)load_safetensors(big); }), "header length 100000001 exceeds the format's limit");
    std::filesystem::remove(big);
  }
  {
    // A header length one byte short on a real file: the last padding byte is read as data.
    const auto good = dir / "good_for_short";
    save_safetensors({{"w", torch::arange(6, torch::kFloat)}}, good);
    auto bytes = read_bytes(good);
    const uint64_t n = static_cast<unsigned char>(bytes[0]) | (uint64_t{static_cast<unsigned char>(bytes[1])} << 8);
    has(err("header_one_short", le64(n - 1) + bytes.substr(8)),
        bytes[8 + n - 1] == ' ' ? "its tensors cover 24 bytes of data but the file holds 25" : "not valid JSON");
  }

  // Offsets in another order than the names are fine when they tile the data.
  const auto odd = dir / "odd_order";
  write_bytes(odd, file_with(R"({"b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]},)"
                             R"( "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})",
                             std::string("\x01\x02\x03\x04", 4)));
  const auto loaded = load_safetensors(odd);
  REQUIRE(loaded.size() == 2);
  CHECK(loaded[0].first == "b");
  CHECK(loaded[0].second[1].item<int>() == 4);
  CHECK(loaded[1].second[0].item<int>() == 1);
}

TEST_CASE("safetensors: a file cut at any length is a loom::Error, never a crash") {
  const auto dir = safetensors_dir("truncated");
  const auto good = dir / "good.safetensors";
  save_safetensors({{"w", torch::randn({3, 3})}, {"b", torch::ones({3}, torch::kBFloat16)}, {"m", torch::tensor({true})}},
                   good, {{"format", "pt"}});
  const std::string bytes = read_bytes(good);
  REQUIRE(load_safetensors(good).size() == 3);
  const auto cut = dir / "cut.safetensors";
  int errors = 0;
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(cut, bytes.substr(0, len));
    const auto msg = error_of([&] { (void)load_safetensors(cut); });
    INFO("cut at " << len << ": " << msg);
    CHECK(msg.rfind("loom: ", 0) == 0);
    errors += msg.rfind("loom: ", 0) == 0;
  }
  CHECK(errors == static_cast<int>(bytes.size()));
  // Cut inside the data: the message says so.
  write_bytes(cut, bytes.substr(0, bytes.size() - 1));
  CHECK(error_of([&] { (void)load_safetensors(cut); }).find("is truncated or corrupt") != std::string::npos);
}

TEST_CASE("safetensors: a file written by loom reads back in Python's safetensors value by value") {
  const char* py = loom_test::python("Python cross-check");
  if (py == nullptr) return;
  const auto dir = safetensors_dir("to_python");
  const auto file = dir / "loom.safetensors";
  const auto input = every_dtype();
  save_safetensors(input, file, {{"format", "pt"}, {"written_by", "loom"}});
  const auto script = dir / "read.py";
  {
    std::ofstream s(script);
    s << "import json, sys\nfrom safetensors import safe_open\nfrom safetensors.torch import load_file\n"
      << kPythonDescribe
      << "tensors = load_file(sys.argv[1])\n"
         "with safe_open(sys.argv[1], framework='pt') as f:\n"
         "    meta = f.metadata()\n"
         "print(json.dumps({'tensors': describe(tensors), 'metadata': meta}))\n";
  }
  const auto out = run_capture(std::string(py) + " " + script.string() + " " + file.string() + " 2>&1");
  INFO("python said: " << out);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(out));
  CHECK(j.at("metadata") == nlohmann::json{{"format", "pt"}, {"written_by", "loom"}});
  REQUIRE(j.at("tensors").size() == input.size());
  for (const auto& [name, t] : input) {
    REQUIRE(j.at("tensors").contains(name));
    check_against_python(name, t, j.at("tensors").at(name));
  }
}

TEST_CASE("safetensors: a file written by Python's save_file reads in loom value by value") {
  const char* py = loom_test::python("Python cross-check");
  if (py == nullptr) return;
  const auto dir = safetensors_dir("from_python");
  const auto file = dir / "python.safetensors";
  const auto script = dir / "write.py";
  {
    std::ofstream s(script);
    s << "import json, sys, torch\nfrom safetensors.torch import save_file\n"
      << kPythonDescribe
      << "g = torch.Generator().manual_seed(0)\n"
         "base = torch.randn(5, 4, generator=g, dtype=torch.float64) * 1000\n"
         "t = {\n"
         "  'f64': base, 'f32': base.float(), 'f16': base.half(), 'bf16': base.bfloat16(),\n"
         "  'i64': torch.tensor([-2**63, -5, 0, 2**63 - 1]), 'i32': torch.tensor([-2**31, 3, 2**31 - 1], dtype=torch.int32),\n"
         "  'i16': torch.arange(-400, 400, 77, dtype=torch.int16), 'i8': torch.arange(-128, 128, 9, dtype=torch.int8),\n"
         "  'u8': torch.arange(0, 256, 7).to(torch.uint8), 'bool': torch.tensor([[True, False], [False, True]]),\n"
         "  'scalar': torch.tensor(-3.25), 'empty': torch.zeros(0, 2, dtype=torch.int32),\n"
         "  'layer.0.weight': base[:3].float().t().contiguous(),\n"
         "}\n"
         "save_file(t, sys.argv[1], metadata={'format': 'pt', 'origin': 'python'})\n"
         "print(json.dumps(describe(t)))\n";
  }
  const auto out = run_capture(std::string(py) + " " + script.string() + " " + file.string() + " 2>&1");
  INFO("python said: " << out);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(out));
  const auto loaded = load_safetensors(file);
  CHECK(loaded.size() == j.size());
  for (const auto& [name, t] : loaded) {
    REQUIRE(j.contains(name));
    check_against_python(name, t, j.at(name));
  }
  CHECK(load_safetensors_metadata(file) ==
        std::map<std::string, std::string>{{"format", "pt"}, {"origin", "python"}});
}

TEST_CASE("save_module / load_module round-trip parameters and buffers under libtorch names") {
  const auto dir = safetensors_dir("module");
  const auto path = dir / "model.safetensors";
  Net a, b;
  randomize(a, 1);
  randomize(b, 2);
  REQUIRE_FALSE(torch::equal(a.fc->weight, b.fc->weight));
  loom::checkpoint::save_module(a, path);
  std::set<std::string> names;
  for (const auto& [name, t] : load_safetensors(path)) names.insert(name);
  CHECK(names == std::set<std::string>{"fc.weight", "fc.bias", "ln.weight", "ln.bias", "running"});

  loom::checkpoint::load_module(b, path);
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& p : pa) {
    INFO("parameter " << p.key());
    CHECK(torch::equal(p.value(), pb[p.key()]));
    CHECK(pb[p.key()].requires_grad());  // still trainable leaves
    CHECK(pb[p.key()].is_leaf());
  }
  CHECK(torch::equal(a.running, b.running));

  // Loading converts to the module's dtype (and device).
  Net c;
  c.to(torch::kFloat64);
  loom::checkpoint::load_module(c, path);
  CHECK_MESSAGE((c.fc->weight.scalar_type() == torch::kFloat64), "dtype differs");
  CHECK(torch::equal(c.fc->weight, a.fc->weight.to(torch::kFloat64)));
  if (torch::cuda::is_available()) {
    Net g;
    g.to(torch::kCUDA);
    loom::checkpoint::load_module(g, path);
    CHECK(g.fc->weight.is_cuda());
    CHECK(torch::equal(g.fc->weight.cpu(), a.fc->weight));
  }

  // A Linear without bias has no (undefined) "bias" entry.
  torch::nn::Linear nobias(torch::nn::LinearOptions(4, 3).bias(false));
  loom::checkpoint::save_module(*nobias, dir / "nobias.safetensors");
  const auto nb = load_safetensors(dir / "nobias.safetensors");
  REQUIRE(nb.size() == 1);
  CHECK(nb[0].first == "weight");
  torch::nn::Linear nobias2(torch::nn::LinearOptions(4, 3).bias(false));
  loom::checkpoint::load_module(*nobias2, dir / "nobias.safetensors");
  CHECK(torch::equal(nobias2->weight, nobias->weight));
}

TEST_CASE("load_module is strict: one error lists every missing, unexpected and mis-shaped tensor") {
  const auto dir = safetensors_dir("strict");
  const auto path = dir / "bad.safetensors";
  Net net;
  randomize(net, 5);
  const auto before = net.ln->weight.clone();
  save_safetensors({{"fc.weight", torch::zeros({3, 5})},
                    {"ln.weight", torch::zeros({3})},
                    {"running", torch::zeros({3})},
                    {"foo", torch::zeros({1})},
                    {"bar.baz", torch::zeros({2})}},
                   path);
  // Unexpected names come in file order (largest dtype first, then by name: all F32 here).
  CHECK(error_of([&] { loom::checkpoint::load_module(net, path); }) ==
        "loom: " + path.string() +
            " does not match the model: missing fc.bias, ln.bias; unexpected bar.baz, foo; "
            "shape of fc.weight is [3, 5] in the file but [3, 4] in the model");
  // Nothing was copied, not even the tensors that matched.
  CHECK(torch::equal(net.ln->weight, before));

  save_safetensors({{"fc.weight", torch::zeros({4, 4})}, {"fc.bias", torch::zeros({3})},
                    {"ln.weight", torch::zeros({3})}, {"ln.bias", torch::zeros({3})},
                    {"running", torch::zeros({})}},
                   path);
  CHECK(error_of([&] { loom::checkpoint::load_module(net, path); }) ==
        "loom: " + path.string() +
            " does not match the model: shape of fc.weight is [4, 4] in the file but [3, 4] in the model; "
            "shape of running is [] in the file but [3] in the model");
  CHECK(error_of([&] { loom::checkpoint::load_module(net, dir / "nope.safetensors"); }).find("does not exist") !=
        std::string::npos);
}

TEST_CASE("safetensors: a file written a tensor at a time, in any order, is save_safetensors' file byte for byte") {
  const auto dir = loom_test::fresh_dir("checkpoint/safetensors_writer");
  const Named tensors = {{"b.weight", torch::randn({3, 5})},
                         {"a.bias", torch::arange(7, torch::kInt64)},
                         {"c.half", torch::randn({4}).to(torch::kHalf)},
                         {"flag", torch::tensor({true, false})}};
  save_safetensors(tensors, dir / "whole.safetensors", {{"format", "pt"}});
  std::vector<loom::checkpoint::SafetensorsWriter::Spec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  {
    loom::checkpoint::SafetensorsWriter writer(dir / "streamed.safetensors", specs, {{"format", "pt"}});
    for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
      CHECK_FALSE(writer.complete());
      writer.write(it->first, it->second);
    }
    CHECK(writer.complete());
    CHECK_FALSE(fs::exists(dir / "streamed.safetensors"));  // only the .tmp until commit
    writer.commit();
  }
  CHECK(read_bytes(dir / "streamed.safetensors") == read_bytes(dir / "whole.safetensors"));
  // A tensor of another dtype is converted to the header's; another shape, a second write, a
  // name the header lacks, and a commit with a tensor missing are refused by name.
  loom::checkpoint::SafetensorsWriter writer(dir / "bad.safetensors", specs);
  writer.write("b.weight", torch::randn({3, 5}, torch::kDouble));
  CHECK(error_of([&] { writer.write("b.weight", torch::randn({3, 5})); }).find("written already") != std::string::npos);
  CHECK(error_of([&] { writer.write("a.bias", torch::arange(6)); }).find("has shape [6], the header [7]") != std::string::npos);
  CHECK(error_of([&] { writer.write("nope", torch::arange(6)); }).find("holds no tensor 'nope'") != std::string::npos);
  CHECK(error_of([&] { writer.commit(); }).find("3 of its tensors were never written") != std::string::npos);
  CHECK(writer.missing().size() == 3);
}

TEST_CASE("safetensors: an unfinished streamed file is removed, never left in place") {
  const auto dir = loom_test::fresh_dir("checkpoint/safetensors_writer_abandoned");
  {
    loom::checkpoint::SafetensorsWriter writer(dir / "w.safetensors", {{"x", torch::kFloat, {2}}});
    CHECK(fs::exists(dir / "w.safetensors.tmp"));
  }
  CHECK_FALSE(fs::exists(dir / "w.safetensors.tmp"));
  CHECK_FALSE(fs::exists(dir / "w.safetensors"));
}

TEST_CASE("safetensors: weights over max_shard_size are HF's shards and index, read back through the index") {
  const auto dir = loom_test::fresh_dir("checkpoint/weights_writer");
  write_bytes(dir / "model.safetensors", "an earlier save's file");  // removed by the commit
  const Named tensors = {{"a", torch::randn({15})},  // 60 bytes
                         {"b", torch::randn({50})},  // 200 bytes: over the limit, a file of its own
                         {"c", torch::randn({6}).to(torch::kDouble)},  // 48 bytes
                         {"d", torch::arange(13, torch::kInt32)}};     // 52 bytes
  std::vector<loom::checkpoint::SafetensorsWriter::Spec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  loom::checkpoint::WeightsWriter writer(dir, specs, 110, 84, {{"format", "pt"}});
  // huggingface_hub's split: b alone at once; a and c together (108 bytes); d starts the next.
  CHECK(writer.files() == std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                   "model-00003-of-00003.safetensors"});
  for (const auto& [name, t] : tensors) writer.write(name, t);
  writer.commit();
  CHECK_FALSE(fs::exists(dir / "model.safetensors"));
  const auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == 360);
  CHECK(index["metadata"]["total_parameters"] == 84);
  CHECK(index["weight_map"]["b"] == "model-00001-of-00003.safetensors");
  CHECK(index["weight_map"]["a"] == "model-00002-of-00003.safetensors");
  CHECK(index["weight_map"]["c"] == "model-00002-of-00003.safetensors");
  CHECK(index["weight_map"]["d"] == "model-00003-of-00003.safetensors");
  CHECK(loom::checkpoint::has_model_weights(dir));
  // model.safetensors is absent: the index beside it says where each tensor lies.
  const auto found = loom::checkpoint::locate_model_weights(dir / "model.safetensors");
  REQUIRE(found.size() == 4);
  for (const auto& at : found) {
    CAPTURE(at.entry.name);
    const auto want = std::find_if(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == at.entry.name; });
    REQUIRE(want != tensors.end());
    CHECK(torch::equal(loom::checkpoint::read_tensor(at), want->second));
  }
  // A second save under the limit: one model.safetensors again, the shards and index removed.
  loom::checkpoint::WeightsWriter again(dir, specs, 1000, 84);
  for (const auto& [name, t] : tensors) again.write(name, t);
  again.commit();
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  CHECK_FALSE(fs::exists(dir / "model-00001-of-00003.safetensors"));
}
