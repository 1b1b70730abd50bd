// Data: sampler order (against torch::randperm and against Python's torch), collation,
// TensorDataset, DataLoader batch counts, the IDX reader on the real Fashion-MNIST files.
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/idx.hpp>
#include <loom/data/sampler.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {
struct Pair {
  torch::Tensor x, labels;
};
struct ByExample {
  int64_t n;
  int64_t size() const { return n; }
  Pair get(int64_t i) const { return {torch::full({2}, static_cast<float>(i)), torch::tensor(i)}; }
};

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

using loom_test::run_capture;
}  // namespace

TEST_CASE("the epoch permutation is randperm from a generator seeded seed + epoch") {
  for (int64_t epoch : {0, 1, 5}) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(42 + epoch));
    auto expected = torch::randperm(1000, gen, torch::kLong);
    auto got = loom::data::RandomSampler{42}.order(1000, epoch);
    CHECK(torch::equal(got, expected));
  }
  // Different epochs give different orders; the same epoch the same one.
  loom::data::RandomSampler s{7};
  CHECK_FALSE(torch::equal(s.order(100, 0), s.order(100, 1)));
  CHECK(torch::equal(s.order(100, 3), s.order(100, 3)));
}

TEST_CASE("the epoch permutation equals Python torch.randperm with the same seed") {
  const char* py = loom_test::python("Python cross-check");
  if (py == nullptr) return;
  const std::string script =
      "import torch\n"
      "for e in (0, 1, 2):\n"
      "    g = torch.Generator(); g.manual_seed(1234 + e)\n"
      "    print(' '.join(map(str, torch.randperm(50, generator=g).tolist())))\n";
  const std::string out = run_capture(std::string(py) + " -c \"" + script + "\"");
  std::istringstream lines(out);
  for (int64_t e = 0; e < 3; ++e) {
    std::string line;
    REQUIRE(std::getline(lines, line));
    std::istringstream nums(line);
    std::vector<int64_t> expected;
    for (int64_t v; nums >> v;) expected.push_back(v);
    CHECK(to_vector(loom::data::RandomSampler{1234}.order(50, e)) == expected);
  }
}

TEST_CASE("collate stacks examples field by field; to_device and field_named use the fields") {
  std::vector<Pair> ex{{torch::ones({3}), torch::tensor(1)}, {torch::zeros({3}), torch::tensor(2)}};
  auto b = loom::data::collate(ex);
  CHECK(b.x.sizes() == torch::IntArrayRef{2, 3});
  CHECK(to_vector(b.labels) == std::vector<int64_t>{1, 2});
  CHECK(loom::data::batch_rows(b) == 2);
  REQUIRE(loom::data::field_named(b, "labels") != nullptr);
  CHECK(loom::data::field_named(b, "labels")->data_ptr() == b.labels.data_ptr());
  CHECK(loom::data::field_named(b, "nope") == nullptr);
  loom::data::to_device(b, torch::Device(torch::kCPU));
  CHECK(b.x.device().is_cpu());
  CHECK_THROWS_WITH_AS(loom::data::collate(std::vector<Pair>{}), "loom: collate needs at least one example",
                       loom::Error);
}

TEST_CASE("TensorDataset gathers rows and rejects fields of different lengths") {
  loom::data::TensorDataset<Pair> ds({torch::arange(10).to(torch::kFloat).unsqueeze(1), torch::arange(10)});
  CHECK(ds.size() == 10);
  std::vector<int64_t> idx{7, 2, 9};
  auto b = ds.get_batch(idx);
  CHECK(to_vector(b.labels) == idx);
  CHECK(b.x.squeeze(1).to(torch::kLong).equal(b.labels));
  CHECK_THROWS_WITH_AS(loom::data::TensorDataset<Pair>({torch::zeros({10, 1}), torch::zeros({9})}),
                       "loom: TensorDataset field 'labels' has 9 rows but the first field has 10", loom::Error);
}

TEST_CASE("DataLoader: batch count, drop_last, the last partial batch, example datasets") {
  using loom::data::AnyDataset;
  using loom::data::DataLoader;
  AnyDataset<Pair> ds(ByExample{10});
  DataLoader<Pair> keep(ds, 4, false, loom::data::SequentialSampler{});
  DataLoader<Pair> drop(ds, 4, true, loom::data::SequentialSampler{});
  CHECK(keep.size() == 3);
  CHECK(drop.size() == 2);
  keep.set_epoch(0);
  auto last = keep.batch(2);
  CHECK(to_vector(last.labels) == std::vector<int64_t>{8, 9});
  CHECK(last.x.sizes() == torch::IntArrayRef{2, 2});
  CHECK_THROWS_AS((void)keep.batch(3), loom::Error);
  // Shuffled: every index exactly once per epoch, in the sampler's order.
  DataLoader<Pair> shuffled(ds, 3, false, loom::data::RandomSampler{5});
  shuffled.set_epoch(2);
  std::vector<int64_t> seen;
  for (int64_t i = 0; i < shuffled.size(); ++i) {
    auto v = to_vector(shuffled.batch(i).labels);
    seen.insert(seen.end(), v.begin(), v.end());
  }
  CHECK(seen == to_vector(loom::data::RandomSampler{5}.order(10, 2)));
  CHECK_THROWS_WITH_AS(DataLoader<Pair>(ds, 0, false, loom::data::SequentialSampler{}),
                       "loom: batch size must be positive, got 0", loom::Error);
}

TEST_CASE("read_idx reads Debian's Fashion-MNIST and rejects broken files") {
  const std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  auto labels = loom::data::read_idx(dir / "t10k-labels-idx1-ubyte.gz");
  CHECK(labels.sizes() == torch::IntArrayRef{10000});
  CHECK(labels.max().item<int>() == 9);
  CHECK(labels.min().item<int>() == 0);
  auto images = loom::data::read_idx(dir / "t10k-images-idx3-ubyte.gz");
  CHECK(images.sizes() == torch::IntArrayRef{10000, 28, 28});
  // Ten classes of 1000 test images each.
  CHECK(torch::bincount(labels.to(torch::kLong)).eq(1000).all().item<bool>());

  std::filesystem::create_directories(loom_test::tmp_root());
  const auto bad = loom_test::tmp_root() / "truncated.idx";
  {
    std::ofstream out(bad, std::ios::binary);
    const unsigned char head[] = {0, 0, 8, 1, 0, 0, 0, 100, 1, 2, 3};
    out.write(reinterpret_cast<const char*>(head), sizeof head);
  }
  CHECK_THROWS_WITH_AS(loom::data::read_idx(bad), doctest::Contains("is truncated or not an IDX file"), loom::Error);
  CHECK_THROWS_WITH_AS(loom::data::read_idx(dir / "missing.gz"), doctest::Contains("does not exist"), loom::Error);
}
