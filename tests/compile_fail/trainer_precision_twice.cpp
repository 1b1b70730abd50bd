// expect: loom: the precision policy family is named twice
#include <loom/loom.hpp>
using Bad = loom::DefaultTrainer<torch::nn::Linear, loom::precision::FP32, loom::precision::FP32>;
int main() { return sizeof(Bad) > 0 ? 0 : 1; }
