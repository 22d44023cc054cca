// Where a generation's caches live: host memory for the CPU provider, GPU memory for CUDA and
// TensorRT (as runtime/backends/ort_session.py's OrtDeviceMemory). Buffers are zero-filled once
// when made; a pass then reads and writes them in place through I/O binding.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace specx {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // What ONNX Runtime is told about a buffer of this memory.
  virtual const Ort::MemoryInfo& info() const = 0;
  virtual void* allocate_zeroed(size_t bytes) = 0;
  virtual void release(void* pointer) noexcept = 0;
};

// Host memory (the CPU provider), or the GPU `device_id` through the CUDA runtime that
// ONNX Runtime's CUDA provider has loaded.
std::shared_ptr<DeviceMemory> device_memory(const std::string& provider, int device_id);

// One zero-filled buffer, released with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(std::shared_ptr<DeviceMemory> memory, size_t bytes)
      : memory_(std::move(memory)), pointer_(memory_->allocate_zeroed(bytes)) {}
  ~DeviceBuffer() { memory_->release(pointer_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return pointer_; }

 private:
  std::shared_ptr<DeviceMemory> memory_;
  void* pointer_;
};

}  // namespace specx
