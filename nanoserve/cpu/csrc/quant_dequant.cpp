// dequantize_into: a packed quantized weight written out as a plain (N, K) float32 or bf16
// matrix, for the batches where a blocked GEMM on the dequantized weight beats streaming it.
//
// Each value is (q - zero) * scale in float32, the same two roundings as
// QuantizedWeight.dequantize, so the float32 result is bit-equal to it (bf16: that, rounded to
// nearest even). int4: one output's 32-bit word of chunk c holds its k = 8c..8c+7 (nibble
// positions 0, 4, 1, 5, 2, 6, 3, 7), so with AVX-512 two chunks are one broadcast, one variable
// shift that puts each lane's nibble at the bottom, one 16-entry permute to the signed value,
// and a subtract and multiply: 16 consecutive outputs of a row per handful of instructions.
// int8 ((K, 32) blocks, k-major): a row's 16 k by one gather of stride 32.
#include "ops.h"
#include "quant_common.h"

#include <immintrin.h>

namespace nanoserve {

namespace {

using quant::kBlockN;

template <typename T>
inline void put(T* dst, int64_t i, float v) {
  dst[i] = T(v);
}

// Row j of an int4 block: K values into dst.
template <typename T>
void int4_row(const uint8_t* wb, int64_t j, int64_t K, int64_t gs, const float* sc,
              const float* zf, T* dst) {
  const uint8_t* base = wb + (j / 16) * 64 + (j % 16) * 4;
  const int64_t chunks = K / 8;
  int64_t c = 0;
#if defined(__AVX512F__)
  const __m512i shifts = _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28,
                                           0, 16, 4, 20, 8, 24, 12, 28);
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  for (; c + 2 <= chunks; c += 2) {
    uint32_t w0, w1;
    std::memcpy(&w0, base + c * 128, 4);
    std::memcpy(&w1, base + (c + 1) * 128, 4);
    const __m512i v = _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(w0)), 0xFF00,
                                             static_cast<int>(w1));
    __m512 q = _mm512_permutexvar_ps(_mm512_srlv_epi32(v, shifts), table);
    const int64_t g0 = 8 * c / gs, g1 = 8 * (c + 1) / gs;
    if (zf)
      q = _mm512_sub_ps(q, _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(zf[g0 * kBlockN + j]),
                                                _mm512_set1_ps(zf[g1 * kBlockN + j])));
    const __m512 out = _mm512_mul_ps(q, _mm512_mask_blend_ps(
                                            0xFF00, _mm512_set1_ps(sc[g0 * kBlockN + j]),
                                            _mm512_set1_ps(sc[g1 * kBlockN + j])));
    if constexpr (std::is_same_v<T, float>) {
      _mm512_storeu_ps(dst + 8 * c, out);
    } else {
#if defined(__AVX512BF16__)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8 * c),
                          (__m256i)_mm512_cvtneps_pbh(out));
#else
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, out);
      for (int i = 0; i < 16; ++i) put(dst, 8 * c + i, tmp[i]);
#endif
    }
  }
#endif
  for (; c < chunks; ++c) {
    uint32_t w;
    std::memcpy(&w, base + c * 128, 4);
    const int64_t g = 8 * c / gs;
    const float s = sc[g * kBlockN + j], z = zf ? zf[g * kBlockN + j] : 0.f;
    for (int p = 0; p < 8; ++p) {
      int q = static_cast<int>((w >> (4 * p)) & 0xF);
      q = q >= 8 ? q - 16 : q;
      put(dst, 8 * c + (p < 4 ? 2 * p : 2 * (p - 4) + 1), (float(q) - z) * s);
    }
  }
}

#if defined(__AVX512F__)
template <typename T>
inline void store16(T* dst, __m512 v) {
  if constexpr (std::is_same_v<T, float>) {
    _mm512_storeu_ps(dst, v);
  } else {
#if defined(__AVX512BF16__)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(v));
#else
    alignas(64) float tmp[16];
    _mm512_store_ps(tmp, v);
    for (int i = 0; i < 16; ++i) put(dst, i, tmp[i]);
#endif
  }
}
#endif

// Row j of an int8 ((K, 32) bytes) block: K values into dst. With AVX-512, 16 k at a time by a
// gather of the 32-bit words at the row's bytes (stride 32), each sign-extended from its low
// byte; the last 16 k go one by one, so that no gather reads past the tensor's end.
template <typename T>
void int8_row(const int8_t* wb, int64_t j, int64_t K, int64_t gs, const float* sc,
              const float* zf, T* dst) {
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                           11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(kBlockN));
  if (gs % 16 == 0)
    for (; k + 16 < K; k += 16) {
      const __m512i v = _mm512_i32gather_epi32(idx, wb + k * kBlockN + j, 1);
      __m512 q = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
      const int64_t g = k / gs;
      if (zf) q = _mm512_sub_ps(q, _mm512_set1_ps(zf[g * kBlockN + j]));
      store16(dst + k, _mm512_mul_ps(q, _mm512_set1_ps(sc[g * kBlockN + j])));
    }
#endif
  for (; k < K; ++k) {
    const int64_t g = k / gs;
    const float z = zf ? zf[g * kBlockN + j] : 0.f;
    put(dst, k, (float(wb[k * kBlockN + j]) - z) * sc[g * kBlockN + j]);
  }
}

template <typename T>
void run(T* out, const uint8_t* wp, int64_t block_bytes, const at::Tensor& scale,
         const std::optional<at::Tensor>& zero, int64_t bits, int64_t gs, int64_t N, int64_t K,
         int64_t G, int64_t Nb) {
  at::parallel_for(0, Nb, 1, [&](int64_t lo, int64_t hi) {
    quant::BlockScales params(scale, zero, N, G, /*want_float=*/true);
    for (int64_t nb = lo; nb < hi; ++nb) {
      params.load(nb);
      const uint8_t* wb = wp + nb * block_bytes;
      const int64_t n0 = nb * kBlockN, width = std::min<int64_t>(kBlockN, N - n0);
      if (bits == 8) {
        for (int64_t j = 0; j < width; ++j)
          int8_row(reinterpret_cast<const int8_t*>(wb), j, K, gs, params.scale(nb),
                   params.zero(nb), out + (n0 + j) * K);
      } else {
        for (int64_t j = 0; j < width; ++j)
          int4_row(wb, j, K, gs, params.scale(nb), params.zero(nb), out + (n0 + j) * K);
      }
    }
  });
}

}  // namespace

void dequantize_into(at::Tensor& buf, const at::Tensor& packed, const at::Tensor& scale,
                     const std::optional<at::Tensor>& zero, int64_t bits, int64_t group_size) {
  TORCH_CHECK_VALUE(buf.dim() == 2 && buf.is_contiguous() &&
                        (buf.scalar_type() == at::kFloat ||
                         buf.scalar_type() == at::kBFloat16),
                    "dequantize_into: buf must be contiguous (N, K) float32 or bfloat16, got ",
                    buf.sizes(), " ", buf.scalar_type());
  const int64_t N = buf.size(0), K = buf.size(1);
  const at::Tensor x_like = at::empty({0, K}, buf.options());
  const at::Tensor out_like = at::empty({0, N}, buf.options());
  const auto c = quant::check("dequantize_into", out_like, x_like, packed, scale, zero, bits,
                              group_size);
  const uint8_t* wp = static_cast<const uint8_t*>(packed.data_ptr());
  const int64_t block_bytes = packed.numel() / c.Nb * packed.element_size();
  if (buf.scalar_type() == at::kFloat)
    run(buf.data_ptr<float>(), wp, block_bytes, scale, zero, bits, group_size, N, K, c.G, c.Nb);
  else
    run(buf.data_ptr<c10::BFloat16>(), wp, block_bytes, scale, zero, bits, group_size, N, K,
        c.G, c.Nb);
}

}  // namespace nanoserve
