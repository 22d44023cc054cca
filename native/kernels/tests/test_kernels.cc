// The kernels' own tests (run by ctest, also under ASan + UBSan): each instruction set against
// the scalar reference bit for bit, every row count 1..70 against the 70-row pass (tile edges), the product
// against a double-precision sum over the dequantized weights, and a changed byte caught.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "attention.h"
#include "kquant_scales.h"
#include "matmul.h"
#include "specx_kernels.h"

namespace {

int failures = 0;

void expect(bool ok, const char* what, const char* format) {
  if (!ok) {
    std::printf("FAIL %s: %s\n", format, what);
    ++failures;
  }
}

uint16_t half_bits(float value) {  // a small positive or negative half, exactly representable
  const int exponent = value < 0.01f ? 8 : 10;  // 2^-7 or 2^-5 range
  std::mt19937 pick(static_cast<unsigned>(value * 1e6f));
  return static_cast<uint16_t>((exponent << 10) | (pick() & 0x3ff) | (value < 0 ? 0x8000 : 0));
}

// Random blocks whose fp16 fields hold small finite scales, so products stay finite.
std::vector<uint8_t> random_blocks(const specx::BlockFormat& f, int64_t n, int64_t k,
                                   std::mt19937& rng) {
  const int64_t blocks = n * (k / f.elements);
  std::vector<uint8_t> data(static_cast<size_t>(blocks * f.bytes));
  for (auto& byte : data) byte = static_cast<uint8_t>(rng());
  std::vector<int> halves;  // byte offsets of fp16 fields
  switch (f.type) {
    case specx::kQ4_1: case specx::kQ5_1: case specx::kQ4_K: case specx::kQ5_K:
      halves = {0, 2};
      break;
    case specx::kQ6_K:
      halves = {208};
      break;
    default:
      halves = {0};
  }
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int offset : halves) {
      const uint16_t h = half_bits(scale(rng));
      data[b * f.bytes + offset] = static_cast<uint8_t>(h & 0xff);
      data[b * f.bytes + offset + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return data;
}

std::vector<float> matmul(const char* isa, const specx::BlockFormat& f,
                          const std::vector<uint8_t>& w, int64_t n, int64_t k,
                          const std::vector<float>& x, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
  char message[256];
  if (specx_kernels_matmul(isa, f.type, w.data(), n, k, x.data(), m, y.data(), message,
                           sizeof message) != SPECX_KERNELS_OK) {
    std::printf("FAIL %s: %s\n", f.name, message);
    ++failures;
  }
  return y;
}

void test_format(int type, std::mt19937& rng) {
  const specx::BlockFormat& f = *specx::find_format(type);
  // 7 columns: AVX-512's two-column tiles and a column left over; blocks of 32: 15 blocks a row,
  // the minimums' eight-block groups ending in a partial one
  const int64_t n = 7, k = f.elements == 32 ? 480 : 512, m = 70;
  const std::vector<uint8_t> w = random_blocks(f, n, k, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = normal(rng);
  const std::vector<float> reference = matmul("scalar", f, w, n, k, x, m);

  // every instruction set and every row count: the scalar 70-row pass's rows, bit for bit
  for (const char* isa : {"scalar", "avx2", "avx512vnni", "neon"}) {
    if (!specx_kernels_isa_supported(isa)) continue;
    for (int64_t rows = 1; rows <= m; ++rows) {
      const std::vector<float> y = matmul(isa, f, w, n, k, x, rows);
      const bool same = std::memcmp(y.data(), reference.data(), y.size() * sizeof(float)) == 0;
      if (!same) {
        std::printf("FAIL %s: %s with %lld rows parts from the scalar reference\n", f.name, isa,
                    static_cast<long long>(rows));
        ++failures;
        break;
      }
    }
  }

  // the product against a double-precision sum over dequantized weights and the int8 rows
  std::vector<float> wf(static_cast<size_t>(n * k));
  char message[256];
  expect(specx_kernels_dequantize(type, w.data(), n, k, wf.data(), message, sizeof message) == 0,
         "dequantize", f.name);
  const int block = specx::activation_block(f);
  specx::Activations activations;
  const specx::QuantRows rows = activations.quantize(specx::Isa::kScalar, f, x.data(), m, k);
  const int8_t* q = rows.q;
  const float* d = rows.d;
  double worst = 0.0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double term =
            static_cast<double>(wf[c * k + i]) * d[(r * k + i) / block] * q[r * k + i];
        sum += term;
        magnitude += std::fabs(term);
      }
      const double error = std::fabs(sum - reference[r * n + c]) / (magnitude + 1e-30);
      worst = error > worst ? error : worst;
    }
  }
  expect(worst < 1e-5, "the product strays from the dequantized weights' sum", f.name);

  // negative control: one byte of one block changed changes some output
  std::vector<uint8_t> changed = w;
  changed[changed.size() / 2] ^= 0x11;
  const std::vector<float> other = matmul("scalar", f, changed, n, k, x, m);
  expect(std::memcmp(other.data(), reference.data(), other.size() * sizeof(float)) != 0,
         "a changed block byte went unnoticed", f.name);
}

void test_bad_input() {
  float x[32] = {}, y[1] = {};
  uint8_t w[64] = {};
  char message[256] = {};
  double peak = -1.0;
  expect(specx_kernels_peak(nullptr, 0.0, &peak, message, sizeof message) ==
             SPECX_KERNELS_BAD_ARGUMENT && peak == -1.0,
         "a peak over no time is refused", "peak");
  expect(specx_kernels_peak("mmx", 0.01, &peak, message, sizeof message) ==
             SPECX_KERNELS_UNSUPPORTED_ISA, "a peak of an unknown instruction set is refused", "peak");
  expect(specx_kernels_matmul(nullptr, 10, w, 1, 32, x, 1, y, message, sizeof message) ==
             SPECX_KERNELS_UNKNOWN_TYPE && std::strstr(message, "Q4_K") != nullptr,
         "an unknown type is refused naming the held ones", "Q2_K");
  expect(specx_kernels_matmul(nullptr, specx::kQ4_0, w, 1, 48, x, 1, y, message, sizeof message) ==
             SPECX_KERNELS_BAD_ARGUMENT, "k off the block size is refused", "Q4_0");
  expect(specx_kernels_matmul("mmx", specx::kQ4_0, w, 1, 32, x, 1, y, message, sizeof message) ==
             SPECX_KERNELS_UNSUPPORTED_ISA, "an unknown instruction set is refused", "Q4_0");
  expect(specx_kernels_matmul(nullptr, specx::kQ4_0, nullptr, 1, 32, x, 1, y, message,
                              sizeof message) == SPECX_KERNELS_BAD_ARGUMENT,
         "a null pointer is refused", "Q4_0");
}

// Each instruction set's product peak: a positive rate, and on x86 (run natively, where ARM64's
// runs under an emulator) above the scalar loop's.
void test_peak() {
  char message[256] = {};
  double scalar = 0.0;
  expect(specx_kernels_peak("scalar", 0.02, &scalar, message, sizeof message) == SPECX_KERNELS_OK &&
             scalar > 0.0 && std::isfinite(scalar),
         "the scalar peak is a positive rate", "peak");
  for (const char* isa : {"avx2", "avx512vnni", "neon"}) {
    if (!specx_kernels_isa_supported(isa)) continue;
    double rate = 0.0;
    const int status = specx_kernels_peak(isa, 0.02, &rate, message, sizeof message);
#if defined(__x86_64__)
    const bool above = rate > scalar;
#else
    const bool above = rate > 0.0;
#endif
    expect(status == SPECX_KERNELS_OK && std::isfinite(rate) && above,
           "a SIMD peak is a rate above the scalar loop's", isa);
  }
}

// Every instruction set's activation quantizer against the scalar one, with infinities, NaN,
// zeros and values at rounding ties among the rows.
void test_quantize_rows(std::mt19937& rng) {
  const int64_t m = 6, k = 512;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = normal(rng);
  x[3] = INFINITY;
  x[k + 300] = NAN;
  for (int64_t i = 2 * k; i < 3 * k; ++i) x[static_cast<size_t>(i)] = 0.0f;
  for (int64_t i = 3 * k; i < 4 * k; ++i) x[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i % 7);
  for (int type : {specx::kQ8_0, specx::kQ4_K}) {  // blocks of 32 and 256
    const specx::BlockFormat& f = *specx::find_format(type);
    specx::Activations reference;
    const specx::QuantRows a = reference.quantize(specx::Isa::kScalar, f, x.data(), m, k);
    for (specx::Isa isa : {specx::Isa::kAvx2, specx::Isa::kAvx512Vnni, specx::Isa::kNeon}) {
      if (!specx::isa_supported(isa)) continue;
      specx::Activations other;
      const specx::QuantRows b = other.quantize(isa, f, x.data(), m, k);
      const size_t blocks = static_cast<size_t>(m * k / a.block), chunks = static_cast<size_t>(m * k / 32);
      const bool same = std::memcmp(a.q, b.q, static_cast<size_t>(m * k)) == 0 &&
                        std::memcmp(a.d, b.d, blocks * sizeof(float)) == 0 &&
                        std::memcmp(a.s, b.s, chunks * sizeof(int32_t)) == 0 &&
                        std::memcmp(a.fs, b.fs, chunks * sizeof(float)) == 0 &&
                        std::memcmp(a.s16, b.s16, 2 * chunks * sizeof(int16_t)) == 0;
      expect(same, "an instruction set quantizes activations differently", specx::isa_name(isa));
      if (b.pairs != nullptr) {  // pairs hold the rows' own codes, scales and sums
        const specx::PairBlock& pb = b.pairs[k / 256 + 1];  // pair 1, block 1
        const bool held = std::memcmp(pb.q[3][1], a.q + 3 * k + 256 + 3 * 32, 32) == 0 &&
                          pb.da[9] == a.d[3 * (k / 256) + 1] && pb.fs[9] == a.fs[3 * (k / 32) + 9] &&
                          pb.s16[0][5] == a.s16[2 * (k / 16) + 16 + 5];
        expect(held, "row pairs do not hold their rows' values", specx::isa_name(isa));
      }
    }
  }
}

void test_kquant_scales(std::mt19937& rng) {
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t q[12], scales[8], mins[8];
    for (auto& byte : q) byte = static_cast<uint8_t>(rng());
    specx::kquant_scales_mins(q, scales, mins);
    for (int j = 0; j < 8; ++j) {
      int s = 0, m = 0;
      specx::kquant_scale_min(j, q, &s, &m);
      if (s != scales[j] || m != mins[j]) {
        expect(false, "word-wise scales differ from the byte-wise reference", "Q4_K");
        return;
      }
    }
  }
}


// Cache attention: a pass of several new tokens gives each row and the cache the bits of
// one-token passes at the same positions, and stays near a double-precision reference.
struct AttentionCase {
  specx::AttentionShape shape;
  std::vector<float> q, k, v, cos, sin;
};

std::vector<float> run_attention(const AttentionCase& c, int64_t first, int64_t count,
                                 std::vector<float>& keys, std::vector<float>& values,
                                 specx::Isa isa = specx::active_isa()) {
  specx::AttentionShape s = c.shape;
  s.seq = count;
  const int64_t qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  std::vector<float> out(static_cast<size_t>(count * qw));
  const int32_t total = static_cast<int32_t>(first + count);
  const specx::AttentionJob job{s, c.q.data() + first * qw, c.k.data() + first * kw,
                                c.v.data() + first * kw, &total, c.cos.data(), c.sin.data(),
                                keys.data(), values.data(), out.data()};
  specx::attention_store(job, 0);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t g = 0; g < s.kv_heads; ++g) specx::attention_group(isa, job, 0, i, g);
  }
  return out;
}

double reference_attention(const AttentionCase& c, int64_t position, int64_t h, int64_t d) {
  const specx::AttentionShape& s = c.shape;
  const int64_t g = h / (s.heads / s.kv_heads), half = s.rotary_dim / 2;
  auto rotated = [&](const float* x, int64_t p, int64_t e) -> double {
    if (e >= s.rotary_dim) return x[e];
    const double cs = c.cos[p * half + e % half], sn = c.sin[p * half + e % half];
    return e < half ? x[e] * cs - x[e + half] * sn : x[e] * cs + x[e - half] * sn;
  };
  const float* q = c.q.data() + position * s.heads * s.head_dim + h * s.head_dim;
  const int64_t lo = s.window > 0 ? std::max<int64_t>(0, position + 1 - s.window) : 0;
  std::vector<double> w;
  double top = -1e300, sum = 0.0, out = 0.0;
  for (int64_t j = lo; j <= position; ++j) {
    const float* k = c.k.data() + j * s.kv_heads * s.head_dim + g * s.head_dim;
    double dot = 0.0;
    for (int64_t e = 0; e < s.head_dim; ++e) dot += rotated(q, position, e) * rotated(k, j, e);
    w.push_back(dot * s.scale);
    top = std::max(top, w.back());
  }
  for (double& x : w) sum += (x = std::exp(x - top));
  for (int64_t j = lo; j <= position; ++j) {
    out += w[j - lo] * c.v[j * s.kv_heads * s.head_dim + g * s.head_dim + d];
  }
  return out / sum;
}

void test_attention(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t window : {-1, 3}) {
    AttentionCase c;
    c.shape = specx::AttentionShape{1, 0, 4, 2, 12, 16, 8, window, 0.3f};
    const int64_t tokens = 9, qw = 4 * 12, kw = 2 * 12;
    for (auto* x : {&c.q, &c.k, &c.v}) {
      x->resize(static_cast<size_t>(tokens * (x == &c.q ? qw : kw)));
      for (auto& e : *x) e = normal(rng);
    }
    for (int64_t p = 0; p < 16; ++p) {
      for (int64_t e = 0; e < 4; ++e) {
        c.cos.push_back(std::cos(0.1f * static_cast<float>(p * (e + 1))));
        c.sin.push_back(std::sin(0.1f * static_cast<float>(p * (e + 1))));
      }
    }
    const size_t cache = 2 * 16 * 12;
    std::vector<float> k1(cache, 0.0f), v1(cache, 0.0f), k2(cache, 0.0f), v2(cache, 0.0f);
    std::vector<float> alone;
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> o = run_attention(c, t, 1, k1, v1);
      alone.insert(alone.end(), o.begin(), o.end());
    }
    std::vector<float> wide = run_attention(c, 0, 3, k2, v2);  // a prompt, then a verify pass
    const std::vector<float> rest = run_attention(c, 3, tokens - 3, k2, v2);
    wide.insert(wide.end(), rest.begin(), rest.end());
    expect(std::memcmp(alone.data(), wide.data(), alone.size() * sizeof(float)) == 0 &&
               k1 == k2 && v1 == v2,
           "a several-token pass parts from one-token passes", "attention");
    for (specx::Isa isa : {specx::Isa::kScalar, specx::Isa::kAvx2, specx::Isa::kNeon}) {
      if (!specx::isa_supported(isa)) continue;
      std::vector<float> k4(cache, 0.0f), v4(cache, 0.0f);
      const std::vector<float> other = run_attention(c, 0, tokens, k4, v4, isa);
      expect(std::memcmp(other.data(), alone.data(), alone.size() * sizeof(float)) == 0,
             "an instruction set's attention parts from the others", specx::isa_name(isa));
    }
    double worst = 0.0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t d = 0; d < 12; ++d) {
          const double want = reference_attention(c, t, h, d);
          worst = std::max(worst, std::fabs(want - alone[t * qw + h * 12 + d]));
        }
      }
    }
    expect(worst < 1e-5, "attention strays from the double-precision reference", "attention");
    // negative control: a key the window hides changes nothing, one it shows changes the row
    std::vector<float> k3(cache, 0.0f), v3(cache, 0.0f);
    c.k[0] += 1.0f;
    const std::vector<float> moved = run_attention(c, 0, tokens, k3, v3);
    const bool last_same = std::memcmp(moved.data() + (tokens - 1) * qw,
                                       alone.data() + (tokens - 1) * qw, qw * sizeof(float)) == 0;
    const bool near_same =  // position 2 sees key 0 with or without the window
        std::memcmp(moved.data() + 2 * qw, alone.data() + 2 * qw, qw * sizeof(float)) == 0;
    expect(!near_same && last_same == (window > 0), "the window shows the wrong keys", "attention");
  }
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  for (int type : {2, 3, 6, 7, 8, 12, 13, 14}) test_format(type, rng);
  test_bad_input();
  test_peak();
  test_kquant_scales(rng);
  test_quantize_rows(rng);
  test_attention(rng);
  std::printf("%s (dispatch: %s)\n", failures ? "FAILED" : "ok", specx_kernels_isa());
  return failures ? 1 : 0;
}
