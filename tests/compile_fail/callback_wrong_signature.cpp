// expect: loom: a callback's on_log has the wrong signature
#include <loom/loom.hpp>
struct Batch {
  torch::Tensor x, labels;
};
struct BadCallback {
  void on_log(int not_the_args) {}
};
struct T : loom::Trainer<T, torch::nn::Linear, loom::Callbacks<BadCallback>> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& b) { return model->forward(b.x).sum(); }
};
int main() {
  loom::TrainingArguments args;
  T t(args, torch::nn::Linear(2, 1), loom::data::TensorDataset<Batch>({torch::zeros({4, 2}), torch::zeros({4})}));
  t.train();
}
