# Smoke run of the default example: a few steps on a slice of the data, then a check that
# the outputs HF users expect were written and hold the expected keys.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
run_example(fashion_mnist --max_steps 30 --logging_steps 10 --max_eval_samples 512)
check_outputs(30 eval_accuracy eval_loss train_loss train_runtime train_samples_per_second)
message("example smoke ok")
