// expect: loom: cannot tell the batch type: the Trainer subclass has no compute_loss\(Model&, Batch&\)
#include <loom/loom.hpp>
struct Batch {
  torch::Tensor x, labels;
};
// No compute_loss, and Linear's forward takes a tensor, not a batch.
struct Bad : loom::Trainer<Bad, torch::nn::Linear> {
  using Trainer::Trainer;
};
int main() {
  loom::TrainingArguments args;
  auto data = loom::data::TensorDataset<Batch>({torch::zeros({4, 2}), torch::zeros({4})});
  Bad t(args, torch::nn::Linear(2, 1), data, data);
  t.train();
  t.evaluate();
}
