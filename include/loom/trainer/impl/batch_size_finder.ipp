#pragma once
// BatchSizeFinder (trainer/batch_size_finder.hpp).

#include <loom/checkpoint/folders.hpp>
#include <loom/config/json.hpp>
#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/trainer/batch_size_finder.hpp>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <loom/metrics/memory.hpp>  // LOOM_HAS_CUDA_ALLOCATOR_STATS
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <string_view>

namespace loom {

LOOM_INLINE bool is_out_of_memory(const std::exception_ptr& error) {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError&) {
    return true;
  } catch (const std::exception& e) {
    const std::string_view what = e.what();
    for (std::string_view sign : {" out of memory.", "DefaultCPUAllocator: can't allocate memory",
                                  "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED."})
      if (what.find(sign) != std::string_view::npos) return true;
    return false;
  } catch (...) {
    return false;
  }
}

namespace detail {
inline std::vector<torch::Device> generator_devices() {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available())
    for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i)
      devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
  return devices;
}
}  // namespace detail

LOOM_INLINE BatchSizeFinder::BatchSizeFinder(TrainingArguments& args,
                                             const std::optional<std::filesystem::path>& resume,
                                             torch::nn::Module& module)
    : args_(&args), module_(&module), original_batch_size_(args.per_device_train_batch_size),
      original_resume_(args.resume_from_checkpoint) {
  if (resume) {
    args.resume_from_checkpoint = resume->string();
    const auto file = *resume / checkpoint::kTrainerStateFile;
    const auto state = json::read_file(file);
    const auto size = json::Fields(state, file.string()).optional_integer("train_batch_size", 1);
    if (size && *size > 0) args.per_device_train_batch_size = *size;
  }
  torch::NoGradGuard no_grad;
  for (const auto& p : module.parameters()) params_.push_back(p.detach().to(torch::kCPU, false, /*copy=*/true));
  for (const auto& b : module.buffers())
    buffers_.push_back(b.defined() ? b.detach().to(torch::kCPU, false, /*copy=*/true) : torch::Tensor());
  for (const auto& d : detail::generator_devices())
    generators_.emplace_back(d, at::globalContext().defaultGenerator(d).get_state());
}

LOOM_INLINE BatchSizeFinder::~BatchSizeFinder() {
  args_->per_device_train_batch_size = original_batch_size_;
  args_->resume_from_checkpoint = original_resume_;
}

LOOM_INLINE bool BatchSizeFinder::retry(const std::exception_ptr& error) {
  if (!is_out_of_memory(error)) return false;
  const int64_t failed = args_->per_device_train_batch_size;
  const int64_t next = reduced_batch_size(failed);
  check(next > 0, "--auto_find_batch_size found no batch size that fits: training ran out of memory at "
        "per_device_train_batch_size {} (the next size, int({} x 0.9), is 0)", failed, failed);
  log_message(LogLevel::warning,
              "out of memory at per_device_train_batch_size {}; training again from the start with {} "
              "(--auto_find_batch_size)", failed, next);
  {
    torch::NoGradGuard no_grad;
    const auto params = module_->parameters();
    const auto buffers = module_->buffers();
    check(params.size() == params_.size() && buffers.size() == buffers_.size(),
          "--auto_find_batch_size: the model's parameters changed during training; it cannot be restored");
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto p = params[i];
      p.detach().copy_(params_[i]);
      p.mutable_grad() = torch::Tensor();
    }
    for (std::size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i].defined() && buffers_[i].defined()) buffers[i].detach().copy_(buffers_[i]);
  }
  for (const auto& [device, state] : generators_) {
    auto generator = at::globalContext().defaultGenerator(device);
    generator.set_state(state);
  }
#if defined(LOOM_HAS_CUDA_ALLOCATOR_STATS)
  if (torch::cuda::is_available()) c10::cuda::CUDACachingAllocator::emptyCache();  // accelerate's clear_device_cache
#endif
  args_->per_device_train_batch_size = next;
  return true;
}

}  // namespace loom
