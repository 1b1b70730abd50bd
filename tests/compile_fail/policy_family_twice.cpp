// expect: loom: the schedule policy family is named twice
#include <loom/policy/bundle.hpp>
using Bad = loom::PolicyBundle<loom::schedule::Linear, loom::schedule::Cosine>;
Bad::schedule* p = nullptr;
int main() { return 0; }
