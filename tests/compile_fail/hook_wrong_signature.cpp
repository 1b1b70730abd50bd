// expect: loom: the override of compute_loss has the wrong signature
#include <loom/loom.hpp>
struct Batch {
  torch::Tensor x, labels;
};
struct Bad : loom::Trainer<Bad, torch::nn::Linear> {
  using Trainer::Trainer;
  using batch_type = Batch;
  // Takes the batch by value and an extra flag: not compute_loss(Model&, Batch&).
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch batch, bool extra) { return model->forward(batch.x).sum(); }
};
int main() {
  loom::TrainingArguments args;
  Bad t(args, torch::nn::Linear(2, 1), loom::data::TensorDataset<Batch>({torch::zeros({4, 2}), torch::zeros({4})}));
  t.train();
}
