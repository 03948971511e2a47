// W8A8: int8 weights times int8 activations, quantized per token inside the call, summed exactly
// in int32.
//
// Each row of x is rounded to int8 against its own scale max|x| / 127, as
// nanoserve/quantization/rtn.py's quantize_per_token does it (a float32 division, rounded half
// to even, clamped to [-128, 127]; a zero row takes scale 1), so the kernel's integers are the
// reference's integers and the only difference from fake quantization then F.linear is the
// order of float32 rounding in the end: out = float(sum_k xq wq) * sx[m] * w_scale[n] + bias.
//
// AVX-512 VNNI: _mm512_dpbusd_epi32 multiplies 4 unsigned bytes by 4 signed bytes and adds the
// four products into a 32-bit lane, 64 multiply-adds an instruction. The activations are made
// unsigned by adding 128 (xq ^ 0x80), and the 128 * sum_k w[n, k] this adds is taken off at the
// end with a per-column sum stored in the packed weight. The packed block is (K/4, 32, 4): one
// 4-byte lane per output and k-quad, so one broadcast quad of a row meets 16 outputs at once.
// AVX2 fallback (no VNNI): bytes sign-extended to int16 and _mm256_madd_epi16, which adds
// pairs of int16 products into int32: exact as well, 16 multiply-adds an instruction.
#include "ops.h"
#include "vec.h"

#include <immintrin.h>

#include <cmath>
#include <string>
#include <vector>

namespace nanoserve {

std::string resolve_isa(const std::string& isa, const char* op);  // quant_gemm.cpp

namespace {

constexpr int64_t kBlockN = 32;
constexpr int64_t kMaxRows = 8;

int64_t block_bytes(int64_t K) { return (K + 3) / 4 * 4 * kBlockN + 4 * kBlockN; }

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define NANOSERVE_W8A8_VNNI 1
// Rows [0, M) of xu against one block -> int32 sums, offset removed. xu holds the rows' k-quads
// (unsigned, offset by 128) transposed, 8 to a quad: quad q of row m is the word xu[q * 8 + m].
template <int M>
void vnni_block(const int32_t* xu, const int8_t* wb, int64_t K4, int32_t* out) {
  constexpr int S = M == 1 ? 4 : (M == 2 ? 2 : 1);  // independent chains for few rows
  __m512i acc[S][M][2];
  _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s)
    _Pragma("GCC unroll 8") for (int m = 0; m < M; ++m)
      acc[s][m][0] = acc[s][m][1] = _mm512_setzero_si512();
  int64_t q = 0;
  for (; q < K4; q += S) {
    _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s) {
      const int64_t qq = q + s < K4 ? q + s : K4 - 1;  // a short tail repeats the last quad...
      const bool live = q + s < K4;                    // ...into nothing
      const int8_t* w = wb + qq * 128;
      if constexpr (M < 8) {  // 8 rows: a prefill tile, the block is read again from L1
        _mm_prefetch(reinterpret_cast<const char*>(w + 8192), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + 8192 + 64), _MM_HINT_T0);
      }
      const __m512i w0 = live ? _mm512_loadu_si512(w) : _mm512_setzero_si512();
      const __m512i w1 = live ? _mm512_loadu_si512(w + 64) : _mm512_setzero_si512();
      _Pragma("GCC unroll 8") for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_set1_epi32(xu[qq * kMaxRows + m]);
        acc[s][m][0] = _mm512_dpbusd_epi32(acc[s][m][0], xv, w0);
        acc[s][m][1] = _mm512_dpbusd_epi32(acc[s][m][1], xv, w1);
      }
    }
  }
  const int32_t* colsum = reinterpret_cast<const int32_t*>(wb + K4 * 128);
  const __m512i off0 = _mm512_slli_epi32(_mm512_loadu_si512(colsum), 7);
  const __m512i off1 = _mm512_slli_epi32(_mm512_loadu_si512(colsum + 16), 7);
  _Pragma("GCC unroll 8") for (int m = 0; m < M; ++m) {
    __m512i lo = acc[0][m][0], hi = acc[0][m][1];
    _Pragma("GCC unroll 8") for (int s = 1; s < S; ++s) {
      lo = _mm512_add_epi32(lo, acc[s][m][0]);
      hi = _mm512_add_epi32(hi, acc[s][m][1]);
    }
    _mm512_storeu_si512(out + m * kBlockN, _mm512_sub_epi32(lo, off0));
    _mm512_storeu_si512(out + m * kBlockN + 16, _mm512_sub_epi32(hi, off1));
  }
}
using VnniFn = void (*)(const int32_t*, const int8_t*, int64_t, int32_t*);
constexpr VnniFn kVnni[kMaxRows] = {vnni_block<1>, vnni_block<2>, vnni_block<3>, vnni_block<4>,
                                    vnni_block<5>, vnni_block<6>, vnni_block<7>, vnni_block<8>};
#endif

// One row (int16, K4 quads) against one block by _mm256_madd_epi16 -> 32 exact int32 sums.
__attribute__((target("avx2,fma"))) void madd_row(const int16_t* x16, const int8_t* wb,
                                                  int64_t K4, int32_t* out) {
  __m256i acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_si256();
  for (int64_t q = 0; q < K4; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(wb + q * 128 + 8192), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wb + q * 128 + 8192 + 64), _MM_HINT_T0);
    int64_t quad;
    std::memcpy(&quad, x16 + 4 * q, 8);
    const __m256i xv = _mm256_set1_epi64x(quad);  // (x0, x1, x2, x3) four times
    for (int c = 0; c < 8; ++c) {  // outputs 4c..4c+3, k-quad q: 16 int16
      const __m256i wv = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + q * 128 + 16 * c)));
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(wv, xv));
    }
  }
  alignas(32) int32_t t[8];
  for (int c = 0; c < 8; ++c) {  // lanes (o, k01), (o, k23) per output: add the pairs
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), acc[c]);
    for (int i = 0; i < 4; ++i) out[4 * c + i] = t[2 * i] + t[2 * i + 1];
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const c10::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// Row r (K values) -> int8 in dst, returning its scale: max|x| / 127 (1 for a zero row), each
// value x / scale (a float32 division) rounded half to even and clamped to [-128, 127].
template <typename T>
float quantize_row(const T* r, int64_t K, int8_t* dst, bool vec) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if (vec) {
    __m512 mx = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 m = K - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (K - k)) - 1);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(load16(r + k, m)));
    }
    float s = _mm512_reduce_max_ps(mx) / 127.f;
    s = s == 0.f ? 1.f : s;
    const __m512 sv = _mm512_set1_ps(s);
    const __m512i lo = _mm512_set1_epi32(-128), hi = _mm512_set1_epi32(127);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 m = K - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (K - k)) - 1);
      // cvtps rounds as MXCSR says: to nearest, ties to even, as torch.round
      __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(load16(r + k, m), sv));
      q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
      _mm_mask_storeu_epi8(dst + k, m, _mm512_cvtepi32_epi8(q));
    }
    return s;
  }
#endif
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(float(r[k])));
  float s = amax / 127.f;
  s = s == 0.f ? 1.f : s;
  for (int64_t k = 0; k < K; ++k)
    dst[k] = static_cast<int8_t>(std::min(127.f, std::max(-128.f, std::nearbyint(float(r[k]) / s))));
  return s;
}

// dst[j] = float(acc[j]) * sx * ws[j] + bias[j], j < width, rounded to T once.
template <typename T>
void store_row(const int32_t* acc, float sx, const float* ws, const T* bias, T* dst,
               int64_t width) {
  int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
  for (; j < width; j += 16) {
    const __mmask16 m = width - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (width - j)) - 1);
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, acc + j)),
                                           _mm512_set1_ps(sx)),
                             _mm512_maskz_loadu_ps(m, ws + j));
    if (bias) v = _mm512_add_ps(v, load16(bias + j, m));
    if constexpr (std::is_same_v<T, float>)
      _mm512_mask_storeu_ps(dst + j, m, v);
    else
      _mm256_mask_storeu_epi16(dst + j, m, (__m256i)_mm512_cvtneps_pbh(v));
  }
#endif
  for (; j < width; ++j)
    dst[j] = T(static_cast<float>(acc[j]) * sx * ws[j] + (bias ? float(bias[j]) : 0.f));
}

}  // namespace

at::Tensor pack_int8_weight(const at::Tensor& q) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar,
              "pack_int8_weight: q must be (N, K) int8, got ", q.sizes(), " ", q.scalar_type());
  const int64_t N = q.size(0), K = q.size(1), K4 = (K + 3) / 4;
  const int64_t Nb = (N + kBlockN - 1) / kBlockN;
  const at::Tensor w = q.contiguous();
  // (Nb, bytes): (K/4, 32, 4) bytes, zero-padded, then 32 int32 column sums
  at::Tensor out = at::zeros({Nb, block_bytes(K)}, q.options());
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = out.data_ptr<int8_t>();
  at::parallel_for(0, Nb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t nb = lo; nb < hi; ++nb) {
      int8_t* b = dst + nb * block_bytes(K);
      for (int64_t j = 0; j < kBlockN && nb * kBlockN + j < N; ++j) {
        const int8_t* row = src + (nb * kBlockN + j) * K;
        int32_t sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          b[(k / 4 * kBlockN + j) * 4 + k % 4] = row[k];
          sum += row[k];
        }
        std::memcpy(b + K4 * 128 + 4 * j, &sum, 4);
      }
    }
  });
  return out;
}

void int8_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
               const at::Tensor& w_scale, const std::optional<at::Tensor>& bias,
               const std::string& isa_name) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(x.dim() == 2 && (dtype == at::kFloat || dtype == at::kBFloat16) &&
                        x.stride(1) == 1,
              "int8_gemm: x must be (M, K) float32 or bfloat16 with unit stride over K, got ", x.sizes(), " ", dtype);
  const int64_t M = x.size(0), K = x.size(1), K4 = (K + 3) / 4, N = out.size(1);
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.scalar_type() == at::kChar && packed.is_contiguous() &&
                  packed.size(1) == block_bytes(K),
              "int8_gemm: packed ", packed.sizes(), " ", packed.scalar_type(),
              " is not pack_int8_weight's layout for K=", K);
  const int64_t Nb = packed.size(0);
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == M && out.is_contiguous() &&
                  out.scalar_type() == dtype && N <= Nb * kBlockN && N > (Nb - 1) * kBlockN,
              "int8_gemm: out must be contiguous (", M, ", N) in x's dtype, N in (",
              (Nb - 1) * kBlockN, ", ", Nb * kBlockN, "], got ", out.sizes());
  TORCH_CHECK_VALUE(w_scale.dim() == 1 && w_scale.size(0) == N && w_scale.scalar_type() == at::kFloat &&
                  w_scale.is_contiguous(),
              "int8_gemm: w_scale must be (", N, ",) float32, got ", w_scale.sizes(), " ",
              w_scale.scalar_type());
  if (bias.has_value())
    TORCH_CHECK_VALUE(bias->numel() == N && bias->scalar_type() == dtype && bias->is_contiguous(),
                "int8_gemm: bias must be (", N, ",) in x's dtype, got ", bias->sizes());
  std::string isa = resolve_isa(isa_name, "int8_gemm");
#if !defined(NANOSERVE_W8A8_VNNI)
  TORCH_CHECK_VALUE(isa != "avx512", "int8_gemm: isa 'avx512' needs AVX512-VNNI, not built here");
  isa = "avx2";
#endif
  if (M == 0 || N == 0) return;
  // per-token quantization, as rtn.quantize_per_token rounds it
  const int64_t ldq = 4 * K4;
  std::vector<int8_t> xq(M * ldq, 0);
  std::vector<float> sx(M);
  const bool vec = isa == "avx512";  // the AVX2 build's scalar loop is the one tested there
  // VNNI: (T, K4, 8): tile t's quads, 8 rows to a quad, offset to unsigned; AVX2: int16 rows
  std::vector<int32_t> xu(vec ? (M + kMaxRows - 1) / kMaxRows * K4 * kMaxRows : 0, 0);
  std::vector<int16_t> x16(vec ? 0 : M * ldq, 0);
  at::parallel_for(0, M, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      int8_t* dst = xq.data() + m * ldq;
      if (dtype == at::kFloat)
        sx[m] = quantize_row(x.data_ptr<float>() + m * x.stride(0), K, dst, vec);
      else
        sx[m] = quantize_row(x.data_ptr<c10::BFloat16>() + m * x.stride(0), K, dst, vec);
      if (vec) {
        int32_t* t = xu.data() + (m / kMaxRows) * K4 * kMaxRows + m % kMaxRows;
        for (int64_t q = 0; q < K4; ++q) {
          uint32_t quad;
          std::memcpy(&quad, dst + 4 * q, 4);
          t[q * kMaxRows] = static_cast<int32_t>(quad ^ 0x80808080u);
        }
      } else {
        std::copy(dst, dst + ldq, x16.data() + m * ldq);
      }
    }
  });
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* ws = w_scale.data_ptr<float>();
  float* of = dtype == at::kFloat ? out.data_ptr<float>() : nullptr;
  c10::BFloat16* ob = dtype == at::kFloat ? nullptr : out.data_ptr<c10::BFloat16>();
  const float* bf = of && bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const c10::BFloat16* bb = ob && bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr;
  at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
    alignas(64) int32_t acc[kMaxRows * kBlockN];
    for (int64_t nb = lo; nb < hi; ++nb) {
      const int8_t* wb = wp + nb * block_bytes(K);
      const int64_t n0 = nb * kBlockN, width = std::min<int64_t>(kBlockN, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        const int64_t rows = std::min<int64_t>(kMaxRows, M - m0);
        if (isa == "avx512") {
#if defined(NANOSERVE_W8A8_VNNI)
          kVnni[rows - 1](xu.data() + m0 * K4, wb, K4, acc);
#endif
        } else {
          for (int64_t i = 0; i < rows; ++i)
            madd_row(x16.data() + (m0 + i) * ldq, wb, K4, acc + i * kBlockN);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t o = (m0 + i) * N + n0;
          if (of)
            store_row(acc + i * kBlockN, sx[m0 + i], ws + n0, bf ? bf + n0 : nullptr, of + o,
                      width);
          else
            store_row(acc + i * kBlockN, sx[m0 + i], ws + n0, bb ? bb + n0 : nullptr, ob + o,
                      width);
        }
      }
    }
  });
}

}  // namespace nanoserve
