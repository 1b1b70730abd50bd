// expect: loom: the override of compute_loss has the wrong signature; expected compute_loss\(Model&, Batch&\) -> torch::Tensor or loom::ModelOutput \(HF's return_outputs
// expect_once
// A Trainer template built through select_policies, whose compute_loss carries HF's Python
// signature: every policy combination is a Trainer type of its own, and the error appears once.
#include <loom/loom.hpp>

struct Batch {
  torch::Tensor x, labels;
};

template <class Sharding, class Precision>
struct Bad : loom::Trainer<Bad<Sharding, Precision>, torch::nn::Linear, Sharding, Precision> {
  using Base = loom::Trainer<Bad<Sharding, Precision>, torch::nn::Linear, Sharding, Precision>;
  using Base::Base;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& inputs, bool return_outputs) {
    return model->forward(inputs.x).sum();
  }
};

int main() {
  loom::TrainingArguments args;
  auto data = loom::data::TensorDataset<Batch>({torch::zeros({4, 2}), torch::zeros({4})});
  loom::select_policies(args, [&]<class Sharding, class Precision>() {
    Bad<Sharding, Precision> t(args, torch::nn::Linear(2, 1), data, data);
    t.train();
  });
}
