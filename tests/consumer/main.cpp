// A minimal program using loom as a consumer would: it trains a linear model for a few
// steps on synthetic data and checks that the loss fell.
#include <loom/loom.hpp>

#include <cstdio>

struct Batch {
  torch::Tensor x, labels;
};

struct Consumer : loom::Trainer<Consumer, torch::nn::Linear> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& b) { return torch::mse_loss(model->forward(b.x), b.labels); }
};

int main() {
  loom::set_seed(0);
  auto x = torch::randn({256, 4});
  auto y = x.matmul(torch::tensor({1.0f, -2.0f, 0.5f, 3.0f}).unsqueeze(1));
  loom::TrainingArguments args;
  args.output_dir = "consumer_output";
  args.learning_rate = 0.05;
  args.max_steps = 40;
  args.logging_steps = 10;
  args.save_strategy = "no";
  args.disable_tqdm = true;
  Consumer trainer(args, torch::nn::Linear(4, 1), loom::data::TensorDataset<Batch>({x, y}));
  trainer.train();
  const auto& h = trainer.state().log_history;
  const double first = h.front()["loss"].get<double>(), last = h[h.size() - 2]["loss"].get<double>();
  std::printf("first loss %.4f, last loss %.4f\n", first, last);
  if (!(last < first * 0.5)) return 1;
  std::printf("consumer ok\n");
  return 0;
}
