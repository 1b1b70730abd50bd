// expect: loom: a Trainer argument after Model is not a loom policy
#include <loom/policy/bundle.hpp>
using Bad = loom::PolicyBundle<loom::schedule::Linear, int>;
Bad::schedule* p = nullptr;
int main() { return 0; }
