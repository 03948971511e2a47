// The weight-only quantized matmul's AVX-512 blocks: one packed block of 32 output features
// against up to 8 rows, the weights widened in registers, sums in float32.
//
// int4 (quant_gemm.cpp packs it): a block is K/8 chunks of two 64-byte lines, outputs 0-15 and
// 16-31; each 32-bit lane of a line is one output's 8 nibbles (two's complement), positions 0-3
// holding k = 0, 2, 4, 6 of the chunk and 4-7 holding k = 1, 3, 5, 7. Two ways to widen it:
// - float32 rows: nibble p of every lane by one shift (srli by 4p) and one vpermps, whose index
//   is the lane's low 4 bits: a 16-entry table of the signed values 0..7, -8..-1. Two
//   instructions per 16 weights, then one FMA per row.
// - bf16 rows (AVX512-BF16): the same line read as 32 16-bit words, one shift (srli_epi16 by 4i)
//   and one vpermw per k-pair i turn every word into the bf16 of its nibble i; the low word of
//   each lane is k = 2i and the high word k = 2i + 1, exactly the pair _mm512_dpbf16_ps wants
//   against a broadcast pair of the row. Small integers are exact in bf16, so each product is
//   exact and 32 multiply-adds cost one instruction: at 8 rows the float32 path is bound by its
//   FMAs (two weights' worth a cycle per row), this one by half as many instructions.
// int8: a block is (K, 32) bytes; one vpmovsxbd from memory and one convert per 16 weights.
//
// Each group of inputs sums into fresh accumulators, then folds once into the outputs:
// out += scale * (sum - zero * sum_x_group), so the scale costs one FMA per group and lane, not
// one per weight; the outputs stay in registers across the groups where they fit (up to 4 rows)
// and reach acc_out once. With few rows the accumulators are split into S sets by k, summed at
// the fold: the float path's 2 FMA pipes x 4 cycles of latency want 8 independent chains, the
// bf16 path's dot products (6 cycles, 2 a cycle) about 16. At one row int4 had 8 and was bound
// by that latency: 16 chains took a block 12% faster in cache (2-core Zen 5 EPYC).
//
// What a call costs, measured there (one thread, in cache, 3072 x 576, group 32, bf16 rows):
// int4 2.1 ns a 128-byte chunk at one row (~69 GB/s of checkpoint bytes, against ~40 GB/s from
// memory), int8 ~57 GB/s; at 8 rows both are bound by the dot products (int4 16 GB/s: the same
// count per weight as the bf16 kernel plus the widening), not by bytes. The shifts, permutes,
// conversions and dot products all issue at about two a cycle there, so fewer instructions per
// weight is the whole game: int4 at one row is 2.75 per 32 weights (a shift for 3 of 4 k-pairs,
// a vpermw, a dot product).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace nanoserve {
namespace qavx512 {

constexpr int64_t kBlockN = 32;
constexpr int64_t kPrefetch = 8192;  // bytes ahead in the weight stream
#define NANOSERVE_UNROLL_Q _Pragma("GCC unroll 8")

// The rows come transposed, 8 to a k, so that every broadcast is one address off one pointer:
// x[k * 8 + m] (float32) and xb[(k / 2) * 8 + m] (a bf16 k-pair as one 32-bit word).
constexpr int64_t kRowsT = 8;

struct Args {
  const float* x;       // (K, 8) float32 rows (the float path)
  const int32_t* xb;    // (K / 2, 8) bf16 pairs (the bf16 path), or null
  const uint8_t* w;     // this block
  int64_t group_size, groups;
  const float* scale;   // (G, 32): this block's scales, transposed, or null and...
  const uint16_t* scale16;  // ...(G, 32) bf16 (pack_scales' copies of bf16 scales)
  const float* zero;    // (G, 32) zero points as float, or null
  const float* sum_x;   // (M, G) each row's group sums (with zero points), or null
  float* acc_out;       // (M, 32), accumulated into
};

constexpr int sets(int M) { return M == 1 ? 4 : (M == 2 ? 2 : 1); }

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define NANOSERVE_QUANT_AVX512 1

template <int M>
inline void zero_out(__m512 (&out)[M][2]) {
  NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m) out[m][0] = out[m][1] = _mm512_setzero_ps();
}

template <int M, int S>
inline void zero_acc(__m512 (&acc)[S][M][2]) {
  NANOSERVE_UNROLL_Q for (int s = 0; s < S; ++s)
    NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m)
      acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps();
}

inline void prefetch_lines(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch + 64), _MM_HINT_T0);
}

// sets for the bf16 paths: 2 * M * S independent chains of dot products (about 16 hide the
// dot product's 6-cycle latency at its 2 a cycle)
constexpr int bf16_sets(int M) { return M == 1 ? 8 : (M == 2 ? 4 : (M <= 4 ? 2 : 1)); }
// the outputs stay in registers across groups where they fit beside the accumulators
constexpr bool out_in_regs(int M, int S) { return 2 * M * S + 2 * M <= 24; }

template <int M, int S, bool R>
inline void fold_out(const Args& a, int64_t g, __m512 (&acc)[S][M][2], __m512 (&out)[M][2]) {
  NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m)
    NANOSERVE_UNROLL_Q for (int c = 0; c < 2; ++c) {
      __m512 v[S];
      NANOSERVE_UNROLL_Q for (int s = 0; s < S; ++s) v[s] = acc[s][m][c];
      NANOSERVE_UNROLL_Q for (int w = 1; w < S; w *= 2)
        NANOSERVE_UNROLL_Q for (int s = 0; s + w < S; s += 2 * w)
          v[s] = _mm512_add_ps(v[s], v[s + w]);
      __m512 t = v[0];
      if (a.zero)
        t = _mm512_fnmadd_ps(_mm512_loadu_ps(a.zero + g * kBlockN + 16 * c),
                             _mm512_set1_ps(a.sum_x[m * a.groups + g]), t);
      const __m512 sc = a.scale ? _mm512_loadu_ps(a.scale + g * kBlockN + 16 * c)
                               : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                         a.scale16 + g * kBlockN + 16 * c))), 16));
      if constexpr (R) {
        out[m][c] = _mm512_fmadd_ps(sc, t, out[m][c]);
      } else {
        float* o = a.acc_out + m * kBlockN + 16 * c;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(sc, t, _mm512_loadu_ps(o)));
      }
    }
}

template <int M>
inline void add_out(const Args& a, __m512 (&out)[M][2]) {
  NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m)
    NANOSERVE_UNROLL_Q for (int c = 0; c < 2; ++c) {
      float* o = a.acc_out + m * kBlockN + 16 * c;
      _mm512_storeu_ps(o, _mm512_add_ps(out[m][c], _mm512_loadu_ps(o)));
    }
}

// int4 x float32 rows.
template <int M>
void int4_f32(const Args& a) {
  constexpr int S = sets(M);
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  constexpr bool R = out_in_regs(M, S);
  const int64_t chunks = a.group_size / 8;
  __m512 out[M][2];
  zero_out<M>(out);
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 acc[S][M][2];
    zero_acc<M, S>(acc);
    for (int64_t c = g * chunks; c < (g + 1) * chunks; ++c) {
      const uint8_t* line = a.w + c * 128;
      prefetch_lines(line);
      const __m512i l0 = _mm512_loadu_si512(line), l1 = _mm512_loadu_si512(line + 64);
      const float* xk = a.x + c * 8 * kRowsT;
      NANOSERVE_UNROLL_Q for (int p = 0; p < 8; ++p) {
        const __m512 w0 = _mm512_permutexvar_ps(_mm512_srli_epi32(l0, 4 * p), table);
        const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(l1, 4 * p), table);
        const int k = p < 4 ? 2 * p : 2 * (p - 4) + 1;
        NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m) {
          const __m512 xv = _mm512_set1_ps(xk[k * kRowsT + m]);
          acc[p % S][m][0] = _mm512_fmadd_ps(xv, w0, acc[p % S][m][0]);
          acc[p % S][m][1] = _mm512_fmadd_ps(xv, w1, acc[p % S][m][1]);
        }
      }
    }
    fold_out<M, S, R>(a, g, acc, out);
  }
  if constexpr (R) add_out<M>(a, out);
}

#if defined(__AVX512BF16__)
#define NANOSERVE_QUANT_BF16_DP 1
// 32 float32 sums (+ a bf16 bias) rounded to bf16 to nearest-even, as c10::BFloat16 rounds.
inline void store_bf16(const float* a, const void* bias, void* out) {
  __m512 lo = _mm512_loadu_ps(a), hi = _mm512_loadu_ps(a + 16);
  if (bias) {
    const __m512i b = _mm512_loadu_si512(bias);
    lo = _mm512_add_ps(lo, _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm512_castsi512_si256(b)), 16)));
    hi = _mm512_add_ps(hi, _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(b, 1)), 16)));
  }
  _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// bf16 bit patterns of the signed nibble values, twice (vpermw reads 5 index bits)
alignas(64) inline constexpr uint16_t kNibbleBf16[32] = {
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80};

// one 128-byte chunk (8 k of 32 outputs): k-pair i into set (base + i) % S
template <int M, int S>
inline void int4_chunk(const uint8_t* line, const int32_t* xk, __m512i table, int base,
                       __m512 (&acc)[S][M][2]) {
  prefetch_lines(line);
  const __m512i l0 = _mm512_loadu_si512(line), l1 = _mm512_loadu_si512(line + 64);
  NANOSERVE_UNROLL_Q for (int i = 0; i < 4; ++i) {
    const int s = (base + i) % S;
    const __m512bh w0 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(l0, 4 * i), table);
    const __m512bh w1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(l1, 4 * i), table);
    NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(xk[i * kRowsT + m]);
      acc[s][m][0] = _mm512_dpbf16_ps(acc[s][m][0], xv, w0);
      acc[s][m][1] = _mm512_dpbf16_ps(acc[s][m][1], xv, w1);
    }
  }
}

// int4 x bf16 rows, by bf16 dot products of k-pairs; CH chunks a group (0: a.group_size / 8).
template <int M, int CH = 0>
void int4_bf16(const Args& a) {
  constexpr int S = bf16_sets(M), U = S > 4 ? S / 4 : 1;  // U chunks a step
  constexpr bool R = out_in_regs(M, S);
  const __m512i table = _mm512_load_si512(kNibbleBf16);
  const int64_t chunks = CH ? CH : a.group_size / 8;
  __m512 out[M][2];
  zero_out<M>(out);
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 acc[S][M][2];
    zero_acc<M, S>(acc);
    const uint8_t* wg = a.w + g * chunks * 128;
    const int32_t* xg = a.xb + g * chunks * 4 * kRowsT;
    int64_t c = 0;
    for (; c + U <= chunks; c += U)
      NANOSERVE_UNROLL_Q for (int u = 0; u < U; ++u)
        int4_chunk<M, S>(wg + (c + u) * 128, xg + (c + u) * 4 * kRowsT, table, 4 * u, acc);
    for (; c < chunks; ++c) int4_chunk<M, S>(wg + c * 128, xg + c * 4 * kRowsT, table, 0, acc);
    fold_out<M, S, R>(a, g, acc, out);
  }
  if constexpr (R) add_out<M>(a, out);
}

// int8 x bf16 rows: rows k and k+1 of the (K, 32) block widened to float32 (exact), and each
// lane's two floats, whose low 16 bits are zero (at most 8 significant bits), joined into one
// bf16 pair by one vpermt2w of their high words (or a shift and a ternary-logic OR): 5 or 6
// instructions per 16 outputs and k-pair, then one dot product per row. Needs an even group
// size (a pair never straddles two groups).
// word 2j: lo's high word j (the bf16 of row k, output j), word 2j + 1: hi's (row k + 1)
alignas(64) inline constexpr uint16_t kJoinHigh[32] = {
    1, 33, 3, 35, 5, 37, 7, 39, 9, 41, 11, 43, 13, 45, 15, 47,
    17, 49, 19, 51, 21, 53, 23, 55, 25, 57, 27, 59, 29, 61, 31, 63};

template <int M, int S>
inline void int8_pair(const Args& a, int64_t kk, int s, __m512 (&acc)[S][M][2]) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512i join = _mm512_load_si512(kJoinHigh);
  const uint8_t* r0 = a.w + 2 * kk * kBlockN;
  _mm_prefetch(reinterpret_cast<const char*>(r0 + kPrefetch), _MM_HINT_T0);
  __m512bh w[2];
  NANOSERVE_UNROLL_Q for (int c = 0; c < 2; ++c) {
    const __m512i lo = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + 16 * c)))));
    const __m512i hi = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + kBlockN + 16 * c)))));
    if constexpr (M <= 4)  // one vpermt2w (3-8% faster); at 8 rows shift + OR measured faster
      w[c] = (__m512bh)_mm512_permutex2var_epi16(lo, join, hi);
    else
      w[c] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 16), hi, high, 0xF8);
  }
  NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m) {
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(a.xb[kk * kRowsT + m]);
    acc[s][m][0] = _mm512_dpbf16_ps(acc[s][m][0], xv, w[0]);
    acc[s][m][1] = _mm512_dpbf16_ps(acc[s][m][1], xv, w[1]);
  }
}

template <int M>
void int8_bf16(const Args& a) {
  constexpr int S = bf16_sets(M);
  constexpr bool R = out_in_regs(M, S);
  __m512 out[M][2];
  zero_out<M>(out);
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 acc[S][M][2];
    zero_acc<M, S>(acc);
    const int64_t p0 = g * a.group_size / 2, p1 = p0 + a.group_size / 2;
    int64_t pp = p0;
    for (; pp + S <= p1; pp += S)
      NANOSERVE_UNROLL_Q for (int s = 0; s < S; ++s) int8_pair<M, S>(a, pp + s, s, acc);
    for (; pp < p1; ++pp) int8_pair<M, S>(a, pp, 0, acc);
    fold_out<M, S, R>(a, g, acc, out);
  }
  if constexpr (R) add_out<M>(a, out);
}
#endif

// int8 x float32 rows: (K, 32) bytes, k by k.
template <int M>
void int8_f32(const Args& a) {
  constexpr int S = sets(M);
  constexpr bool R = out_in_regs(M, S);
  __m512 out[M][2];
  zero_out<M>(out);
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512 acc[S][M][2];
    zero_acc<M, S>(acc);
    const int64_t k0 = g * a.group_size, k1 = k0 + a.group_size;
    auto step = [&](__m512 (&ac)[M][2], int64_t k) {
      const uint8_t* row = a.w + k * kBlockN;
      const __m512 w0 = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row))));
      const __m512 w1 = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16))));
      NANOSERVE_UNROLL_Q for (int m = 0; m < M; ++m) {
        const __m512 xv = _mm512_set1_ps(a.x[k * kRowsT + m]);
        ac[m][0] = _mm512_fmadd_ps(xv, w0, ac[m][0]);
        ac[m][1] = _mm512_fmadd_ps(xv, w1, ac[m][1]);
      }
    };
    int64_t k = k0;
    for (; k + S <= k1; k += S)
      NANOSERVE_UNROLL_Q for (int s = 0; s < S; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(a.w + (k + s) * kBlockN + kPrefetch),
                     _MM_HINT_T0);  // a line per two k: the second fetch of it costs no memory
        step(acc[s], k + s);
      }
    for (; k < k1; ++k) step(acc[0], k);
    fold_out<M, S, R>(a, g, acc, out);
  }
  if constexpr (R) add_out<M>(a, out);
}

#endif  // __AVX512F__ && __AVX512BW__

}  // namespace qavx512
}  // namespace nanoserve
