// The one internal error type: a code of specx.h and a message that names the problem and the
// fix. Thrown inside the library, turned into a specx_status at the C ABI (capi.cc).
#pragma once

#include <stdexcept>
#include <string>

#include "specx.h"

namespace specx {

class Failure : public std::runtime_error {
 public:
  Failure(specx_code code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  specx_code code() const { return code_; }

 private:
  specx_code code_;
};

inline Failure invalid(const std::string& what, const std::string& fix = "") {
  return Failure(SPECX_INVALID_ARGUMENT, fix.empty() ? what : what + " (" + fix + ")");
}

inline Failure artifact_error(const std::string& what,
                              const std::string& fix = "re-export the artifact with `specx export`") {
  return Failure(SPECX_ARTIFACT, what + " (" + fix + ")");
}

}  // namespace specx
