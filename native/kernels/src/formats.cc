// The table of held formats.
#include "blocks.h"

namespace specx {

static const BlockFormat kFormats[] = {
    {kQ4_0, "Q4_0", 32, 18, false, decode_q4_0},   {kQ4_1, "Q4_1", 32, 20, true, decode_q4_1},
    {kQ5_0, "Q5_0", 32, 22, false, decode_q5_0},   {kQ5_1, "Q5_1", 32, 24, true, decode_q5_1},
    {kQ8_0, "Q8_0", 32, 34, false, decode_q8_0},   {kQ4_K, "Q4_K", 256, 144, true, decode_q4_k},
    {kQ5_K, "Q5_K", 256, 176, true, decode_q5_k},  {kQ6_K, "Q6_K", 256, 210, false, decode_q6_k},
};

const BlockFormat* find_format(int type) {
  for (const BlockFormat& f : kFormats) {
    if (f.type == type) return &f;
  }
  return nullptr;
}

const char* held_formats() { return "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"; }

}  // namespace specx
