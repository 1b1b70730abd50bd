#pragma once
// The current device of the calling thread. CUDA work that names no device (pinned host
// memory, the caching allocator's allocate(), events, a new context) goes to the thread's
// current device, which is cuda:0 unless set: under torchrun every rank would open a context
// on GPU 0. Start-up makes the rank's cuda:LOCAL_RANK current (as accelerate calls
// torch.cuda.set_device), and so does each prefetch thread.

#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace loom {

/// Makes `device` the calling thread's current device of its type (nothing for the CPU).
inline void make_current(const c10::Device& device) {
  if (device.is_cpu() || !device.has_index()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

}  // namespace loom
