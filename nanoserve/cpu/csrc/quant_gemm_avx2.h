// The weight-only quantized matmul's blocks for a CPU with AVX2 and FMA but no AVX-512.
//
// The packed layouts are the AVX-512 ones (quant_gemm_avx512.h), so packing does not care which
// ISA runs. 16 ymm registers of 8 floats: a 32-output block is 4 registers wide, so rows go in
// tiles of up to 3 (12 accumulators), each tile widening the block's weights again from L1.
// AVX2 has no 16-entry permute, so nibble p of each 32-bit lane is sign-extended by two shifts
// (left by 28 - 4p, arithmetic right by 28: the nibbles are two's complement) and converted;
// int8 by one vpmovsxbd from memory and a convert. Rows are float32 (bf16 rows are widened
// before the call). The functions carry target("avx2,fma") so that they are compiled, and can
// be forced by the tests, in a build for a CPU that also has AVX-512.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "quant_gemm_avx512.h"  // Args

#define NANOSERVE_AVX2_FN __attribute__((target("avx2,fma")))

namespace nanoserve {
namespace qavx2 {

using Args = qavx512::Args;
constexpr int64_t kBlockN = 32;
constexpr int64_t kPrefetch = 8192;
constexpr int kTileRows = 3;

template <int R, int S>
NANOSERVE_AVX2_FN inline void zero_acc(__m256 (&acc)[S][R][4]) {
  NANOSERVE_UNROLL_Q for (int s = 0; s < S; ++s)
    NANOSERVE_UNROLL_Q for (int m = 0; m < R; ++m)
      NANOSERVE_UNROLL_Q for (int c = 0; c < 4; ++c) acc[s][m][c] = _mm256_setzero_ps();
}

// acc_out[m] += scale * (acc[m] - zero * sum_x[m, g]) for rows [0, R) of this tile.
template <int R, int S>
NANOSERVE_AVX2_FN inline void fold(const Args& a, int64_t g, __m256 (&acc)[S][R][4]) {
  NANOSERVE_UNROLL_Q for (int m = 0; m < R; ++m)
    NANOSERVE_UNROLL_Q for (int c = 0; c < 4; ++c) {
      __m256 v = acc[0][m][c];
      NANOSERVE_UNROLL_Q for (int s = 1; s < S; ++s) v = _mm256_add_ps(v, acc[s][m][c]);
      if (a.zero)
        v = _mm256_fnmadd_ps(_mm256_loadu_ps(a.zero + g * kBlockN + 8 * c),
                             _mm256_set1_ps(a.sum_x[m * a.groups + g]), v);
      float* o = a.acc_out + m * kBlockN + 8 * c;
      const __m256 s = a.scale ? _mm256_loadu_ps(a.scale + g * kBlockN + 8 * c)
                               : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                         a.scale16 + g * kBlockN + 8 * c))), 16));
      _mm256_storeu_ps(o, _mm256_fmadd_ps(s, v, _mm256_loadu_ps(o)));
    }
}

template <int P>
NANOSERVE_AVX2_FN inline __m256 nibble(__m256i v) {
  if constexpr (P == 7) return _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 28));
  else return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 28 - 4 * P), 28));
}

template <int R, int S, int P>
NANOSERVE_AVX2_FN inline void int4_step(const Args& a, const float* xk, const __m256i (&l)[4],
                                        __m256 (&acc)[S][R][4]) {
  __m256 w[4];
  NANOSERVE_UNROLL_Q for (int c = 0; c < 4; ++c) w[c] = nibble<P>(l[c]);
  constexpr int k = P < 4 ? 2 * P : 2 * (P - 4) + 1;
  NANOSERVE_UNROLL_Q for (int m = 0; m < R; ++m) {
    const __m256 xv = _mm256_broadcast_ss(xk + k * qavx512::kRowsT + m);
    NANOSERVE_UNROLL_Q for (int c = 0; c < 4; ++c)
      acc[P % S][m][c] = _mm256_fmadd_ps(xv, w[c], acc[P % S][m][c]);
  }
}

// Rows [0, R) of a.x against one int4 block.
template <int R>
NANOSERVE_AVX2_FN void int4_tile(const Args& a) {
  constexpr int S = R == 1 ? 2 : 1;
  const int64_t chunks = a.group_size / 8;
  for (int64_t g = 0; g < a.groups; ++g) {
    __m256 acc[S][R][4];
    zero_acc<R, S>(acc);
    for (int64_t c = g * chunks; c < (g + 1) * chunks; ++c) {
      const uint8_t* line = a.w + c * 128;
      _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetch + 64), _MM_HINT_T0);
      __m256i l[4];
      NANOSERVE_UNROLL_Q for (int q = 0; q < 4; ++q)
        l[q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * q));
      const float* xk = a.x + c * 8 * qavx512::kRowsT;
      int4_step<R, S, 0>(a, xk, l, acc);
      int4_step<R, S, 1>(a, xk, l, acc);
      int4_step<R, S, 2>(a, xk, l, acc);
      int4_step<R, S, 3>(a, xk, l, acc);
      int4_step<R, S, 4>(a, xk, l, acc);
      int4_step<R, S, 5>(a, xk, l, acc);
      int4_step<R, S, 6>(a, xk, l, acc);
      int4_step<R, S, 7>(a, xk, l, acc);
    }
    fold<R, S>(a, g, acc);
  }
}

template <int R>
NANOSERVE_AVX2_FN inline void int8_step(const Args& a, int64_t k, __m256 (&acc)[R][4]) {
  const uint8_t* row = a.w + k * kBlockN;
  __m256 w[4];
  NANOSERVE_UNROLL_Q for (int c = 0; c < 4; ++c)
    w[c] = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * c))));
  NANOSERVE_UNROLL_Q for (int m = 0; m < R; ++m) {
    const __m256 xv = _mm256_broadcast_ss(a.x + k * qavx512::kRowsT + m);
    NANOSERVE_UNROLL_Q for (int c = 0; c < 4; ++c)
      acc[m][c] = _mm256_fmadd_ps(xv, w[c], acc[m][c]);
  }
}

// Rows [0, R) of a.x against one int8 block.
template <int R>
NANOSERVE_AVX2_FN void int8_tile(const Args& a) {
  constexpr int S = R == 1 ? 2 : 1;
  for (int64_t g = 0; g < a.groups; ++g) {
    __m256 acc[S][R][4];
    zero_acc<R, S>(acc);
    const int64_t k0 = g * a.group_size, k1 = k0 + a.group_size;
    int64_t k = k0;
    for (; k + S <= k1; k += S)
      NANOSERVE_UNROLL_Q for (int s = 0; s < S; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(a.w + (k + s) * kBlockN + kPrefetch),
                     _MM_HINT_T0);
        int8_step<R>(a, k + s, acc[s]);
      }
    for (; k < k1; ++k) int8_step<R>(a, k, acc[0]);
    fold<R, S>(a, g, acc);
  }
}

}  // namespace qavx2
}  // namespace nanoserve
