// This process's resident memory and its peak, for tests that bound what an
// operation holds at once (Linux /proc, proc(5)).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace drt::server::testing {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); -1 if absent.
inline int64_t ProcStatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

// Resets the peak (VmHWM) to the current resident size: writing 5 to
// /proc/self/clear_refs. Returns the resident size then.
inline int64_t ResetPeakResident() {
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
  }
  return ProcStatusBytes("VmRSS");
}

}  // namespace drt::server::testing
