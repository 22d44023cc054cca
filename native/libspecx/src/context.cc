#include "context.h"

#include "model.h"

namespace specx {

Context::Context(const Model& model)
    : model_(model), target_(model.target(), model.manifest().max_length) {}

Drafter* Context::drafter(const std::string& name) {
  if (name == "none") return nullptr;
  std::unique_ptr<Drafter>& kept = drafters_[name];
  if (!kept) kept = model_.new_drafter(name);
  return kept.get();
}

}  // namespace specx
