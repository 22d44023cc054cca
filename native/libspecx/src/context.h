// A context: the caches a host keeps between generations (runtime/pipeline.py's workspace, as
// specx_context). The target's cache and every drafter the context has run (each draft model
// with its own cache) stay after a generation ends; the next generation created in it keeps the
// longest prefix of its prompt they hold for its scope and reads only the rest, so a
// conversation's next turn reads only the new turn. One generation at a time.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "drafters.h"
#include "graph.h"

namespace specx {

class Model;

class Context {
 public:
  explicit Context(const Model& model);
  const Model& model() const { return model_; }
  Runner& target() { return target_; }
  // The drafter `name`, made on first use and kept with its cache (nullptr for "none").
  Drafter* drafter(const std::string& name);
  // Take the context for a generation (false: another one holds it).
  bool acquire() { return !busy_.exchange(true); }
  void release() { busy_.store(false); }

 private:
  const Model& model_;
  Runner target_;
  std::map<std::string, std::unique_ptr<Drafter>> drafters_;
  std::atomic<bool> busy_{false};
};

}  // namespace specx
