// The table of held formats (their decoders: blocks/*.h, one file per block family).
#include "blocks/q4_0.h"
#include "blocks/q4_k.h"
#include "blocks/q5_0.h"
#include "blocks/q5_k.h"
#include "blocks/q6_k.h"
#include "blocks/q8_0.h"
#include "blocks.h"

namespace specx {

template <class F>
constexpr BlockFormat format(GgufType type, const char* name) {
  return {type, name, F::kElements, F::kBytes, F::kOffset, &F::decode};
}

static const BlockFormat kFormats[] = {
    format<Q4_0>(kQ4_0, "Q4_0"), format<Q4_1>(kQ4_1, "Q4_1"), format<Q5_0>(kQ5_0, "Q5_0"),
    format<Q5_1>(kQ5_1, "Q5_1"), format<Q8_0>(kQ8_0, "Q8_0"), format<Q4_K>(kQ4_K, "Q4_K"),
    format<Q5_K>(kQ5_K, "Q5_K"), format<Q6_K>(kQ6_K, "Q6_K"),
};

const BlockFormat* find_format(int type) {
  for (const BlockFormat& f : kFormats) {
    if (f.type == type) return &f;
  }
  return nullptr;
}

const char* held_formats() { return "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"; }

}  // namespace specx
