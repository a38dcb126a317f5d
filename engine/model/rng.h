// Counter-based random numbers: a value is a pure function of (seed, key...,
// index), so it needs no saved state and is the same on every machine, in any
// order, after any resume. Used for LoRA init, dropout masks and data shuffling.
#pragma once

#include <cstdint>

namespace ft {

// SplitMix64 finaliser: a good 64-bit mixing function.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Hash of a seed and up to three keys.
inline uint64_t HashKeys(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return Mix64(Mix64(Mix64(Mix64(seed) ^ a) ^ b) ^ c);
}

// Uniform in [0, 1) from the top 24 bits (exact in float).
inline float UniformFloat(uint64_t bits) { return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f); }

// Uniform integer in [0, n) (Lemire's multiply-shift; bias < n / 2^64).
__extension__ typedef unsigned __int128 Uint128;
inline uint64_t UniformIndex(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<Uint128>(bits) * n) >> 64);
}

}  // namespace ft
