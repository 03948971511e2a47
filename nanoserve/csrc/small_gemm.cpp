// A bf16 matmul for decode-sized batches (M <= 8 rows): stream the weight once, at memory speed.
//
// At decode sizes a linear layer is a matrix-vector product in disguise: each weight is read
// once and used M times, so its speed is the speed the weight streams from memory. oneDNN's
// bf16 kernels block for large M and, measured on the machines this book ran on, read small-M
// weights at well under the copy bandwidth. This kernel follows sgl-kernel's tinygemm: the
// weight is repacked once, at load, into column blocks of 32 output features with each pair of
// inputs interleaved (Nb, K/2, 32, 2), so one block is one contiguous stream and one
// _mm512_dpbf16_ps multiplies a k-pair of 16 columns against a broadcast k-pair of one row,
// accumulating in float32. Up to 8 rows x 2 registers of accumulators stay in registers.
//
// It needs AVX512-BF16 (the dpbf16 instruction); elsewhere small_gemm_available() is false and
// the engine keeps oneDNN. Results are float32 sums in another order than oneDNN's, rounded to
// bf16 once: not bit-identical to F.linear, so it serves bf16 only.
#include "ops.h"
#include "vec.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define NANOSERVE_SMALL_GEMM 1
#endif

namespace nanoserve {

constexpr int64_t kBlockN = 32;  // output features per packed block: two zmm of float32
constexpr int64_t kMaxRows = 8;

bool small_gemm_available() {
#ifdef NANOSERVE_SMALL_GEMM
  return true;
#else
  return false;
#endif
}

at::Tensor pack_small_gemm(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pack_small_gemm: takes an (N, K) bfloat16 weight, got ", weight.sizes(), " ",
              weight.scalar_type());
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
    _mm_prefetch(reinterpret_cast<const char*>(w + 2 * kk + 16), _MM_HINT_T0);
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

void small_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                const std::optional<at::Tensor>& bias) {
#ifndef NANOSERVE_SMALL_GEMM
  TORCH_CHECK(false, "small_gemm: built without AVX512-BF16; use F.linear");
#else
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "small_gemm: x must be (M, K) bfloat16 with unit stride over K");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kBlockN && packed.size(3) == 2 &&
                  packed.is_contiguous(),
              "small_gemm: packed must come from pack_small_gemm");
  const int64_t M = x.size(0), K = x.size(1), K2 = packed.size(1), Nb = packed.size(0);
  const int64_t N = out.size(1);
  TORCH_CHECK((K + 1) / 2 == K2, "small_gemm: x has K=", K, ", the weight ", 2 * K2);
  TORCH_CHECK(K % 2 == 0, "small_gemm: K must be even (a k-pair per 32-bit broadcast)");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.is_contiguous() &&
                  out.scalar_type() == at::kBFloat16 && N <= Nb * kBlockN &&
                  N > (Nb - 1) * kBlockN,
              "small_gemm: out must be contiguous (M, N) bfloat16 for this weight");
  const c10::BFloat16* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kBFloat16 &&
                    bias->is_contiguous(), "small_gemm: bias must be (N,) bfloat16");
    bp = bias->data_ptr<c10::BFloat16>();
  }
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  const c10::BFloat16* wp = packed.data_ptr<c10::BFloat16>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const int64_t ldx = x.stride(0);
  at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
    alignas(64) float acc[kMaxRows * kBlockN];
    for (int64_t nb = lo; nb < hi; ++nb) {
      const c10::BFloat16* wb = wp + nb * K2 * kBlockN * 2;
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        const int64_t rows = std::min<int64_t>(kMaxRows, M - m0);
        kBlocks[rows - 1](xp + m0 * ldx, ldx, wb, K2, acc);
        const int64_t n0 = nb * kBlockN, width = std::min<int64_t>(kBlockN, N - n0);
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t j = 0; j < width; ++j) {
            float v = acc[m * kBlockN + j] + (bp ? static_cast<float>(bp[n0 + j]) : 0.f);
            op[(m0 + m) * N + n0 + j] = c10::BFloat16(v);
          }
      }
    }
  });
#endif
}

}  // namespace nanoserve
