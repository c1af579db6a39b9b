#include "worker/model/initializers.h"

#include <cmath>
#include <random>

namespace distrain::init {

uint64_t StableHash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {
// Uniform in [0, 1) from the generator's 53 high bits.
double NextUnit(std::mt19937_64& gen) { return static_cast<double>(gen() >> 11) * 0x1.0p-53; }
}  // namespace

void GlorotUniform(uint64_t seed, int64_t fan_in, int64_t fan_out, Tensor* out) {
  std::mt19937_64 gen(seed);
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  for (int64_t i = 0; i < out->size(); ++i) {
    (*out)[i] = static_cast<float>((2.0 * NextUnit(gen) - 1.0) * limit);
  }
}

void RandomUniform(uint64_t seed, double minval, double maxval, Tensor* out) {
  std::mt19937_64 gen(seed);
  for (int64_t i = 0; i < out->size(); ++i) {
    (*out)[i] = static_cast<float>(minval + NextUnit(gen) * (maxval - minval));
  }
}

}  // namespace distrain::init
