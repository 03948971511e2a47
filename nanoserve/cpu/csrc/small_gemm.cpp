// A matmul for decode-sized batches (M <= 8 rows): stream the weight once, at memory speed.
//
// At decode sizes a linear layer is a matrix-vector product in disguise: each weight is read
// once and used M times, so its speed is the speed the weight streams from memory (or, for a
// model small enough to stay in cache, the speed of the multiply-adds). oneDNN's kernels block
// for large M and, measured on the machines this book ran on, read small-M weights at well
// under the copy bandwidth. This kernel follows sgl-kernel's tinygemm: the weight is repacked
// once, at load, into column blocks of 32 output features, so one block is one contiguous
// stream and up to 8 rows x 2 registers of float32 accumulators stay in registers.
//
// - bf16, (Nb, K/2, 32, 2): each pair of inputs interleaved, so one _mm512_dpbf16_ps multiplies
//   a k-pair of 16 columns against a broadcast k-pair of one row. Needs AVX512-BF16.
// - float32, (Nb, K, 32): one _mm512_fmadd_ps per 16 columns, a broadcast input, a row. Needs
//   AVX-512F.
//
// Where the instruction is missing the *_available op is false and the engine keeps oneDNN. Both
// cache lines of the k-step 8 KiB ahead are prefetched: with 8 rows of work per weight the core
// otherwise runs too few loads ahead to keep memory busy. Measured on a Zen 5 EPYC, one thread,
// 8 rows, bf16: the 576 x 49152 LM head 28 -> 43 GB/s, the 576 -> 3072 gate_up 28 -> 45 GB/s.
// Results are float32 sums in another order than oneDNN's (bf16 rounds them once): not
// bit-identical to F.linear.
#include "ops.h"
#include "vec.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define NANOSERVE_SMALL_GEMM_F32 1
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define NANOSERVE_SMALL_GEMM 1
#endif
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#include "small_gemm_avx2.h"
#define NANOSERVE_SMALL_GEMM_AVX2 1  // both dtypes, 8-wide FMAs (small_gemm_avx2.h)
#endif

namespace nanoserve {

constexpr int64_t kBlockN = 32;  // output features per packed block: two zmm of float32
constexpr int64_t kMaxRows = 8;
constexpr int64_t kPrefetch = 128;  // 64-byte lines ahead in the weight stream: 8 KiB

bool small_gemm_available() {
#if defined(NANOSERVE_SMALL_GEMM) || defined(NANOSERVE_SMALL_GEMM_AVX2)
  return true;
#else
  return false;
#endif
}

bool small_gemm_f32_available() {
#if defined(NANOSERVE_SMALL_GEMM_F32) || defined(NANOSERVE_SMALL_GEMM_AVX2)
  return true;
#else
  return false;
#endif
}

namespace {

// (N, K) float32 -> (Nb, K, 32): block nb holds output features [32 nb, 32 nb + 32), k-major.
at::Tensor pack_f32(const at::Tensor& weight) {
  const int64_t N = weight.size(0), K = weight.size(1), Nb = (N + kBlockN - 1) / kBlockN;
  at::Tensor w = weight.contiguous();
  at::Tensor out = at::zeros({Nb, K, kBlockN}, weight.options());  // zero pads N
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, Nb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t nb = lo; nb < hi; ++nb)
      for (int64_t j = 0; j < kBlockN && nb * kBlockN + j < N; ++j)
        for (int64_t k = 0; k < K; ++k)
          dst[(nb * K + k) * kBlockN + j] = src[(nb * kBlockN + j) * K + k];
  });
  return out;
}

}  // namespace

at::Tensor pack_small_gemm(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == at::kBFloat16 ||
                                    weight.scalar_type() == at::kFloat),
              "pack_small_gemm: takes an (N, K) bfloat16 or float32 weight, got ",
              weight.sizes(), " ", weight.scalar_type());
  if (weight.scalar_type() == at::kFloat) return pack_f32(weight);
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t Nb = (N + kBlockN - 1) / kBlockN, K2 = (K + 1) / 2;
  at::Tensor w = weight.contiguous();
  at::Tensor out = at::zeros({Nb, K2, kBlockN, 2}, weight.options());  // zero pads N and K
  const c10::BFloat16* src = w.data_ptr<c10::BFloat16>();
  c10::BFloat16* dst = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, Nb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t nb = lo; nb < hi; ++nb)
      for (int64_t j = 0; j < kBlockN && nb * kBlockN + j < N; ++j) {
        const c10::BFloat16* row = src + (nb * kBlockN + j) * K;
        for (int64_t k = 0; k < K; ++k)
          dst[((nb * K2 + k / 2) * kBlockN + j) * 2 + k % 2] = row[k];
      }
  });
  return out;
}

#ifdef NANOSERVE_SMALL_GEMM
namespace {

// Rows [0, M) of x (M, K) times one packed block -> 32 float32 outputs per row.
template <int M>
void block(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* wb, int64_t K2,
           float* acc_out) {
  __m512 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  const int32_t* xr[M];
  for (int m = 0; m < M; ++m) xr[m] = reinterpret_cast<const int32_t*>(x + m * ldx);
  const __m512i* w = reinterpret_cast<const __m512i*>(wb);
  for (int64_t kk = 0; kk < K2; ++kk) {
    _mm_prefetch(reinterpret_cast<const char*>(w + 2 * kk + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + 2 * kk + kPrefetch + 1), _MM_HINT_T0);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + 2 * kk);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + 2 * kk + 1);
    for (int m = 0; m < M; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(xr[m][kk]);
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], a, w0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], a, w1);
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm512_storeu_ps(acc_out + m * kBlockN, acc[m][0]);
    _mm512_storeu_ps(acc_out + m * kBlockN + 16, acc[m][1]);
  }
}

using BlockFn = void (*)(const c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t, float*);
constexpr BlockFn kBlocks[kMaxRows] = {block<1>, block<2>, block<3>, block<4>,
                                       block<5>, block<6>, block<7>, block<8>};

}  // namespace
#endif

#ifdef NANOSERVE_SMALL_GEMM_F32
namespace {

// Rows [0, M) of x (M, K) float32 times one packed (K, 32) block -> 32 outputs per row. With
// at most 4 rows there are too few accumulators to hide the multiply-add's latency, so even and
// odd k accumulate apart (S = 2 sets) and meet at the end; a fixed order, so still deterministic.
template <int M>
void block_f32(const float* x, int64_t ldx, const float* wb, int64_t K, float* acc_out) {
  constexpr int S = M <= 4 ? 2 : 1;
  __m512 acc[S][M][2];
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < M; ++m) acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps();
  auto step = [&](__m512 (&a)[M][2], int64_t kk) {  // one k: 32 columns x M rows
    const __m512 w0 = _mm512_loadu_ps(wb + kk * kBlockN);
    const __m512 w1 = _mm512_loadu_ps(wb + kk * kBlockN + 16);
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_set1_ps(x[m * ldx + kk]);
      a[m][0] = _mm512_fmadd_ps(xv, w0, a[m][0]);
      a[m][1] = _mm512_fmadd_ps(xv, w1, a[m][1]);
    }
  };
  int64_t k = 0;
  for (; k + S <= K; k += S)
    for (int s = 0; s < S; ++s) {
      const int64_t kk = k + s;
      _mm_prefetch(reinterpret_cast<const char*>(wb + (2 * kk + kPrefetch) * 16), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wb + (2 * kk + kPrefetch + 1) * 16),
                   _MM_HINT_T0);
      step(acc[s], kk);
    }
  for (; k < K; ++k) step(acc[0], k);  // an odd K's last step, into set 0
  for (int m = 0; m < M; ++m) {
    __m512 lo = acc[0][m][0], hi = acc[0][m][1];
    if constexpr (S == 2) {
      lo = _mm512_add_ps(lo, acc[S - 1][m][0]);
      hi = _mm512_add_ps(hi, acc[S - 1][m][1]);
    }
    _mm512_storeu_ps(acc_out + m * kBlockN, lo);
    _mm512_storeu_ps(acc_out + m * kBlockN + 16, hi);
  }
}

using BlockF32 = void (*)(const float*, int64_t, const float*, int64_t, float*);
constexpr BlockF32 kBlocksF32[kMaxRows] = {block_f32<1>, block_f32<2>, block_f32<3>,
                                           block_f32<4>, block_f32<5>, block_f32<6>,
                                           block_f32<7>, block_f32<8>};

}  // namespace
#endif

namespace {

// Blocks [lo, hi) of the packed weight against every row of x, rows 8 at a time; the float32
// accumulators (plus bias) are rounded to the output's dtype once.
template <typename T, typename X, typename W, typename Block>
void run_blocks(const X* xp, int64_t ldx, int64_t M, const W* wp, int64_t block_elems,
                int64_t inner, const T* bp, T* op, int64_t N, int64_t lo, int64_t hi,
                const Block* blocks) {
  alignas(64) float acc[kMaxRows * kBlockN];
  for (int64_t nb = lo; nb < hi; ++nb) {
    const W* wb = wp + nb * block_elems;
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      const int64_t rows = std::min<int64_t>(kMaxRows, M - m0);
      blocks[rows - 1](xp + m0 * ldx, ldx, wb, inner, acc);
      const int64_t n0 = nb * kBlockN, width = std::min<int64_t>(kBlockN, N - n0);
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t j = 0; j < width; ++j) {
          float v = acc[m * kBlockN + j] + (bp ? static_cast<float>(bp[n0 + j]) : 0.f);
          op[(m0 + m) * N + n0 + j] = T(v);
        }
    }
  }
}

}  // namespace

void small_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                const std::optional<at::Tensor>& bias) {
  const auto dtype = x.scalar_type();
  const bool f32 = dtype == at::kFloat;
  TORCH_CHECK(x.dim() == 2 && (f32 || dtype == at::kBFloat16) && x.stride(1) == 1,
              "small_gemm: x must be (M, K) bfloat16 or float32 with unit stride over K");
  TORCH_CHECK(packed.scalar_type() == dtype && packed.is_contiguous() &&
                  packed.size(2) == kBlockN &&
                  (f32 ? packed.dim() == 3 : packed.dim() == 4 && packed.size(3) == 2),
              "small_gemm: packed must come from pack_small_gemm, in x's dtype");
  const int64_t M = x.size(0), K = x.size(1), Nb = packed.size(0), N = out.size(1);
  const int64_t inner = packed.size(1);  // K (float32) or K/2 pairs (bf16)
  TORCH_CHECK(f32 ? inner == K : (K + 1) / 2 == inner, "small_gemm: x has K=", K,
              ", the weight ", f32 ? inner : 2 * inner);
  TORCH_CHECK(f32 || K % 2 == 0, "small_gemm: K must be even (a k-pair per 32-bit broadcast)");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.is_contiguous() &&
                  out.scalar_type() == dtype && N <= Nb * kBlockN && N > (Nb - 1) * kBlockN,
              "small_gemm: out must be contiguous (M, N) in x's dtype for this weight");
  if (bias.has_value())
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == dtype && bias->is_contiguous(),
                "small_gemm: bias must be (N,) in x's dtype");
  const int64_t ldx = x.stride(0), block_elems = packed.numel() / Nb;
#if defined(NANOSERVE_SMALL_GEMM_AVX2)
  using namespace avx2;
  if (f32) {
    using Fn = void (*)(const float*, int64_t, const float*, int64_t, float*);
    constexpr Fn fns[kMaxRows] = {block<1, F32>, block<2, F32>, block<3, F32>, block<4, F32>,
                                  block<5, F32>, block<6, F32>, block<7, F32>, block<8, F32>};
    const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
      run_blocks(x.data_ptr<float>(), ldx, M, packed.data_ptr<float>(), block_elems, inner, bp,
                 out.data_ptr<float>(), N, lo, hi, fns);
    });
    return;
  }
  // bf16: the rows widened to float32 once (exact), so a broadcast is one load
  using Fn = void (*)(const float*, int64_t, const uint16_t*, int64_t, float*);
  constexpr Fn fns[kMaxRows] = {block<1, BF16>, block<2, BF16>, block<3, BF16>, block<4, BF16>,
                                block<5, BF16>, block<6, BF16>, block<7, BF16>, block<8, BF16>};
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // (M, K)
  const c10::BFloat16* bp = bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr;
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
  at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
    run_blocks(xf.data_ptr<float>(), K, M, wp, block_elems, inner, bp,
               out.data_ptr<c10::BFloat16>(), N, lo, hi, fns);
  });
#else
  if (f32) {
#ifndef NANOSERVE_SMALL_GEMM_F32
    TORCH_CHECK(false, "small_gemm: float32 built without AVX-512F or AVX2; use F.linear");
#else
    const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
      run_blocks(x.data_ptr<float>(), ldx, M, packed.data_ptr<float>(), block_elems, inner, bp,
                 out.data_ptr<float>(), N, lo, hi, kBlocksF32);
    });
#endif
    return;
  }
#ifndef NANOSERVE_SMALL_GEMM
  TORCH_CHECK(false, "small_gemm: bf16 built without AVX512-BF16 or AVX2; use F.linear");
#else
  const c10::BFloat16* bp = bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr;
  at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
    run_blocks(x.data_ptr<c10::BFloat16>(), ldx, M, packed.data_ptr<c10::BFloat16>(),
               block_elems, inner, bp, out.data_ptr<c10::BFloat16>(), N, lo, hi, kBlocks);
  });
#endif
#endif
}

}  // namespace nanoserve
