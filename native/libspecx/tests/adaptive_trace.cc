// -k auto's policy (src/adaptive.cc) fed a scripted run on standard input, one command a line,
// answering on standard output; tests/native/test_libspecx_context.py feeds the same script to
// runtime/decode/adaptive.py and compares the answers, decision for decision:
//   new MAX_K                   a fresh policy
//   inherit                     a fresh policy that inherits what the last one learned
//   ratio R | lazy 0|1          its draft ratio; whether its draft model reads the prompt lazily
//   prefill TOKENS SECONDS      the prompt's passes
//   decide SOURCE [BEHIND LEFT]  prints K (a draft model BEHIND the committed tokens, LEFT
//                               tokens the generation may still make)
//   plan POSITION TOP           the last decision's plan: prints "take more" (0/1 each)
//   observe SOURCE PROPOSED ACCEPTED DRAFT_S VERIFY_S CATCHUP HIT [CONFIDENCE...]
//                               (HIT -1: no lookup offer; 0/1: its first token was right)
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "adaptive.h"

int main() {
  std::unique_ptr<specx::AdaptiveK> policy;
  specx::DraftPlan plan;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "new") {
      int max_k = 8;
      in >> max_k;
      policy = std::make_unique<specx::AdaptiveK>(max_k);
    } else if (command == "inherit") {
      auto fresh = std::make_unique<specx::AdaptiveK>(policy->max_k());
      fresh->inherit(*policy);
      policy = std::move(fresh);
    } else if (command == "ratio") {
      double r = 0;
      in >> r;
      policy->set_draft_ratio(r);
    } else if (command == "lazy") {
      int lazy = 0;
      in >> lazy;
      policy->set_lazy_draft(lazy != 0);
    } else if (command == "prefill") {
      long long tokens = 0;
      std::string seconds;
      in >> tokens >> seconds;
      policy->observe_prefill(tokens, std::strtod(seconds.c_str(), nullptr));
    } else if (command == "decide") {
      std::string source;
      long long behind = 0, left = 0;
      in >> source >> behind >> left;
      auto [k, made] = policy->decide(source, behind, left);
      plan = made;
      std::printf("%d\n", k);
    } else if (command == "plan") {
      int position = 0;
      std::string top;
      in >> position >> top;
      auto [take, more] = plan ? plan(position, std::strtod(top.c_str(), nullptr)) : std::make_pair(true, true);
      std::printf("%d %d\n", int(take), int(more));
    } else if (command == "observe") {
      specx::StepResult step;
      std::string draft_s, verify_s, value;
      long long catchup = 0;
      in >> step.source >> step.proposed >> step.accepted >> draft_s >> verify_s >> catchup >>
          step.lookup_first_hit;
      step.draft_s = std::strtod(draft_s.c_str(), nullptr);
      step.verify_s = std::strtod(verify_s.c_str(), nullptr);
      step.catchup = catchup;
      while (in >> value) step.confidence.push_back(std::strtod(value.c_str(), nullptr));
      policy->observe(step);
    } else if (!command.empty()) {
      std::fprintf(stderr, "unknown command: %s\n", command.c_str());
      return 2;
    }
    std::fflush(stdout);
  }
  return 0;
}
