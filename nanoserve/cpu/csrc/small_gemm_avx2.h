// The small-M matmul's blocks for a CPU with AVX2 and FMA but no AVX-512 (a Zen 3 EPYC, say).
//
// The packed layouts are the AVX-512 ones (small_gemm.cpp): float32 (Nb, K, 32) and bf16
// (Nb, K/2, 32, 2), so packing, the cache of verdicts and the engine do not care which ISA runs.
// What changes is the register budget: 16 ymm of 8 floats, so one 32-column block is 4 registers
// wide and 8 rows of it would need 32 accumulators. A block is therefore covered by tiles of R
// rows by C registers (8 C columns) whose R x C accumulators stay in registers while k runs.
// The tiles are the classic AVX2 ones: 6 rows x 16 columns (12 accumulators, 2 weight
// registers, 1 broadcast) for up to six rows, and 2 rows x 32 columns for the rest; with 12
// independent accumulators the FMA latency (4 cycles, 2 a cycle) is hidden, and each weight
// load feeds 6 FMAs. 8 rows: a 6-row tile over each half of the block, then a 2-row tile over
// all of it.
//
// With 8 rows this is compute-bound, not a streaming loop: two 8-lane FMAs a cycle consume two
// weight elements a cycle across 8 rows, about what one Zen 3 core's memory delivers in float32.
// bf16 weights halve the bytes but not the multiply-adds: each ymm of 16 bf16 (8 columns x a
// k-pair, interleaved as the AVX512-BF16 dot product wants them) widens to two float32
// registers, k even by a 16-bit left shift, k odd by masking the low half, both exact.
// Sums run over k in order per column, in float32: deterministic, not bit-identical to oneDNN.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace nanoserve {
namespace avx2 {

// Every loop over a tile's rows or registers unrolled: left rolled, GCC keeps the accumulator
// array addressable and stores all of it to the stack on every k (12 stores an iteration, and
// the 6 x 16 tile ran at half the speed of the 8 x 8 one).
#define NANOSERVE_UNROLL _Pragma("GCC unroll 8")

constexpr int64_t kBlockN = 32;

// The block is consumed in chunks of kChunk rows (8 KiB, which stay in L1): every tile runs over
// one chunk before any moves to the next, so the later tiles read the chunk from L1, not L2.
// Accumulators go back to acc_out between chunks: 12 stores and loads for every 64 rows.
// Prefetching: a block one tile walks fetches both lines of each row kPrefetch bytes ahead in
// its own stream. A block several tiles walk fetches the same row of the *next* block, one line
// in the first tile and the other in the second, so the fetches are spread over the whole
// block's compute instead of bunched into one tile's share of it.
constexpr int64_t kChunk = 64;
constexpr int64_t kPrefetch = 8192;  // bytes ahead in a one-tile block's stream
constexpr int64_t kRowBytes = 128;   // one packed k-row (float32) or k-pair row (bf16)

// PF says which of the row's two lines this tile fetches ahead: bit 0 the first, bit 1 the second.
template <int PF>
inline void prefetch_row(const void* wb, int64_t k, int64_t ahead) {
  const char* p = static_cast<const char*>(wb) + k * kRowBytes + ahead;
  if constexpr ((PF & 1) != 0) _mm_prefetch(p, _MM_HINT_T0);
  if constexpr ((PF & 2) != 0) _mm_prefetch(p + 64, _MM_HINT_T0);
}

template <int R, int C>
inline void load_acc(__m256 (&acc)[R][C], const float* acc_out, int c0, bool first) {
  NANOSERVE_UNROLL for (int m = 0; m < R; ++m)
    NANOSERVE_UNROLL for (int c = 0; c < C; ++c)
      acc[m][c] = first ? _mm256_setzero_ps()
                        : _mm256_loadu_ps(acc_out + m * kBlockN + 8 * (c0 + c));
}

template <int R, int C>
inline void store_acc(const __m256 (&acc)[R][C], float* acc_out, int c0) {
  NANOSERVE_UNROLL for (int m = 0; m < R; ++m)
    NANOSERVE_UNROLL for (int c = 0; c < C; ++c)
      _mm256_storeu_ps(acc_out + m * kBlockN + 8 * (c0 + c), acc[m][c]);
}

// The two weight kinds, each a tile under one name, so that one block walk serves both (the
// rows are float32 in either: bf16 rows are widened before the walk).
struct F32 {
  using W = float;

  // Rows [0, R) x columns [8 c0, 8 (c0 + C)) of one float32 block, over k in [k0, k1).
  template <int R, int C, int PF>
  static void tile(const float* x, int64_t ldx, const float* wb, int64_t k0, int64_t k1,
                   int c0, bool first, int64_t ahead, float* acc_out) {
    __m256 acc[R][C];
    load_acc<R, C>(acc, acc_out, c0, first);
    for (int64_t k = k0; k < k1; ++k) {
      const float* w = wb + k * kBlockN + 8 * c0;
      prefetch_row<PF>(wb, k, ahead);
      __m256 wv[C];
      NANOSERVE_UNROLL for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(w + 8 * c);
      NANOSERVE_UNROLL for (int m = 0; m < R; ++m) {
        const __m256 xv = _mm256_broadcast_ss(x + m * ldx + k);
        NANOSERVE_UNROLL for (int c = 0; c < C; ++c)
          acc[m][c] = _mm256_fmadd_ps(xv, wv[c], acc[m][c]);
      }
    }
    store_acc<R, C>(acc, acc_out, c0);
  }
};

struct BF16 {
  using W = uint16_t;

  // The same over a bf16 block's k-pairs [k0, k1); x has been widened to float32 rows already.
  template <int R, int C, int PF>
  static void tile(const float* x, int64_t ldx, const uint16_t* wb, int64_t k0, int64_t k1,
                   int c0, bool first, int64_t ahead, float* acc_out) {
    const __m256i hi_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    __m256 acc[R][C];
    load_acc<R, C>(acc, acc_out, c0, first);
    for (int64_t kk = k0; kk < k1; ++kk) {
      const uint16_t* w = wb + kk * 2 * kBlockN + 16 * c0;  // 16 bf16: 8 columns x (k, k+1)
      prefetch_row<PF>(wb, kk, ahead);
      __m256 even[C], odd[C];
      NANOSERVE_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * c));
        even[c] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));  // element 2j: bits 0-15
        odd[c] = _mm256_castsi256_ps(_mm256_and_si256(v, hi_half));  // element 2j+1: bits 16-31
      }
      NANOSERVE_UNROLL for (int m = 0; m < R; ++m) {
        const __m256 x0 = _mm256_broadcast_ss(x + m * ldx + 2 * kk);
        const __m256 x1 = _mm256_broadcast_ss(x + m * ldx + 2 * kk + 1);
        NANOSERVE_UNROLL for (int c = 0; c < C; ++c) {
          acc[m][c] = _mm256_fmadd_ps(x0, even[c], acc[m][c]);
          acc[m][c] = _mm256_fmadd_ps(x1, odd[c], acc[m][c]);
        }
      }
    }
    store_acc<R, C>(acc, acc_out, c0);
  }
};

// The tiles for M rows: up to 6 rows in 16-column tiles (two of them), the rest (at most 2)
// in one 32-column tile.
template <int M>
struct Plan {
  static constexpr int kTall = M <= 2 ? 0 : (M < 6 ? M : 6);
  static constexpr int kRest = M - kTall;
  static_assert(kRest <= 2, "a 32-column tile holds at most 2 rows (8 accumulators)");
};

// One block of M rows, chunk by chunk, through the tiles Plan<M> names; `rows` is the block's
// depth in packed rows (K for float32, K/2 k-pairs for bf16).
template <int M, typename Kind>
void block(const float* x, int64_t ldx, const typename Kind::W* wb, int64_t rows,
           float* acc_out) {
  using P = Plan<M>;
  // one tile: kPrefetch ahead in this block's stream; several: the same row of the next block
  const int64_t ahead = P::kTall > 0 ? rows * kRowBytes : kPrefetch;
  for (int64_t k0 = 0; k0 < rows; k0 += kChunk) {
    const int64_t k1 = k0 + kChunk < rows ? k0 + kChunk : rows;
    const bool first = k0 == 0;
    if constexpr (P::kTall > 0) {  // a 16-column tile over each half, both lines prefetched
      Kind::template tile<P::kTall, 2, 1>(x, ldx, wb, k0, k1, 0, first, ahead, acc_out);
      Kind::template tile<P::kTall, 2, 2>(x, ldx, wb, k0, k1, 2, first, ahead, acc_out);
    }
    if constexpr (P::kRest > 0)  // it prefetches only where it is the block's one tile
      Kind::template tile<P::kRest, 4, P::kTall == 0 ? 3 : 0>(
          x + P::kTall * ldx, ldx, wb, k0, k1, 0, first, ahead, acc_out + P::kTall * kBlockN);
  }
}

}  // namespace avx2
}  // namespace nanoserve
