// expect: loom: the override of compute_loss has the wrong signature; expected compute_loss\(Model&, Batch&\) -> torch::Tensor or loom::ModelOutput \(HF's return_outputs
#include <loom/loom.hpp>
struct Batch {
  torch::Tensor x, labels;
};
// HF's Python signature, compute_loss(model, inputs, return_outputs), carried over as is.
struct Bad : loom::Trainer<Bad, torch::nn::Linear> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& inputs, bool return_outputs) {
    return model->forward(inputs.x).sum();
  }
};
int main() {
  loom::TrainingArguments args;
  auto data = loom::data::TensorDataset<Batch>({torch::zeros({4, 2}), torch::zeros({4})});
  Bad t(args, torch::nn::Linear(2, 1), data, data);
  t.train();
}
