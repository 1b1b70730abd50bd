// expect: batch_field<(loom::data::detail::)?FieldName<7>\{"labels"\}, std::vector<long( int)?> ?>
#include <loom/loom.hpp>
#include <vector>
struct Batch {
  torch::Tensor x;
  std::vector<int64_t> labels;  // not a tensor
};
struct Bad : loom::Trainer<Bad, torch::nn::Linear> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& b) { return model->forward(b.x).sum(); }
};
int main() {
  struct Good {
    torch::Tensor x, labels;
  };
  loom::TrainingArguments args;
  auto data = loom::data::TensorDataset<Good>({torch::zeros({4, 2}), torch::zeros({4})});
  Bad t(args, torch::nn::Linear(2, 1), data);
  t.train();
}
