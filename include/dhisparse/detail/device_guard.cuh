/**
 * @file detail/device_guard.cuh
 * @brief Running an owner's work on its own device whatever the caller's current device
 *        is: `device_guard` (a scope on a device, the caller's device restored on exit) and
 *        `device_binding` (the device an owner belongs to, kept as its first member so that
 *        its other members are destroyed on that device).
 */
#pragma once

#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <string>

namespace dhisparse::detail {

/**
 * @brief The device ordinal an owner configured with `requested` runs on: `requested`
 *        itself (checked against the devices present), or the current device for -1.
 * @throws dhisparse::error for an ordinal below -1 or beyond the devices present
 */
inline int chosen_device(int requested, char const* who)
{
  DHISPARSE_EXPECTS(requested >= -1, std::string(who) + ": device must be -1 (the current device) or an ordinal");
  if (requested == -1) {
    int current = 0;
    DHISPARSE_CUDA_TRY(cudaGetDevice(&current));
    return current;
  }
  int count = 0;
  DHISPARSE_CUDA_TRY(cudaGetDeviceCount(&count));
  DHISPARSE_EXPECTS(requested < count, std::string(who) + ": device " + std::to_string(requested) + " is not present (" +
                                         std::to_string(count) + " devices)");
  return requested;
}

/**
 * @brief Makes `device` current for the guard's lifetime and restores the caller's current
 *        device at its end (also when an exception leaves the scope). Cheap when `device`
 *        is current already: one `cudaGetDevice`, no `cudaSetDevice`. Neither call is
 *        refused inside a stream capture.
 */
class device_guard {
 public:
  /// @throws dhisparse::error when the device cannot be made current
  explicit device_guard(int device) : device_{device}
  {
    DHISPARSE_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) {
      DHISPARSE_CUDA_TRY(cudaSetDevice(device));
      switched_ = true;
    }
  }
  device_guard(device_guard const&)            = delete;
  device_guard& operator=(device_guard const&) = delete;
  ~device_guard()
  {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) { cudaGetLastError(); }
  }

  /// The device made current.
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  int device_   = 0;
  int previous_ = 0;
  bool switched_ = false;
};

/**
 * @brief The device an owner belongs to. Declared as the owner's first member (destroyed
 *        last): the owner's destructor calls `enter_for_destruction`, so that its other
 *        members return their memory on this device, and this member's destructor then
 *        restores the caller's device. Moves copy the ordinal only.
 */
class device_binding {
 public:
  explicit device_binding(int device) noexcept : device_{device} {}
  device_binding(device_binding&& o) noexcept : device_{o.device_} {}
  device_binding& operator=(device_binding&& o) noexcept
  {
    device_ = o.device_;
    return *this;
  }
  device_binding(device_binding const&)            = delete;
  device_binding& operator=(device_binding const&) = delete;
  ~device_binding()
  {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) { cudaGetLastError(); }
  }

  [[nodiscard]] int device() const noexcept { return device_; }

  /// A scope on the owner's device (see `device_guard`).
  [[nodiscard]] device_guard enter() const { return device_guard{device_}; }

  /// Makes the owner's device current until this object is destroyed (never throws).
  void enter_for_destruction() noexcept
  {
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (current != device_ && !switched_) {
      if (cudaSetDevice(device_) != cudaSuccess) {
        cudaGetLastError();
        return;
      }
      previous_ = current;
      switched_ = true;
    }
  }

 private:
  int device_    = 0;
  int previous_  = 0;
  bool switched_ = false;
};

}  // namespace dhisparse::detail
