// Weight-only quantized matmul for decode-sized batches: int4 or int8 weights, float32 or bf16
// rows, streamed once per step and widened in registers.
//
// A decode step reads every weight once, so its speed is bytes per second divided by bytes per
// weight: int4 with a scale per 32 weights reads about a quarter of bf16's bytes. The weights
// are repacked once, at load, into blocks of 32 output features (quant_gemm_avx512.h says how
// each byte is laid out and why: nibbles unpacked by a shift and a 16-entry permute), and each
// group of inputs is summed in float32 registers before its scale is applied once per output:
//
//   out[m, n] = bias[n] + sum_g scale[n, g] * (sum_{k in g} x[m, k] q[n, k] - zero[n, g] sx[m, g])
//
// with sx[m, g] the row's sum over group g (computed once per call, only with zero points).
// The result is rounded to out's dtype once. Against dequantize-then-F.linear in float32 the
// sums run in another order: equal to float32 rounding, not to the bit.
//
// isa "avx512" (AVX-512F/BW; with AVX512-BF16, bf16 rows meet int4 and int8 weights through
// bf16 dot products, the integers being exact in bf16), "avx2" (AVX2 + FMA, compiled with a
// target attribute so a build for an AVX-512 CPU carries both and the tests run both), or
// "auto": the widest built. Scales come as (N, G) float32/bf16, transposed per block on every
// call, or as pack_scales' (N/32, G, 32) copies made once at load (faster). A call allocates
// nothing (the rows' scratch is per thread and reused) and asks for the head of the weight and
// scale streams before it copies the rows, since the kernels prefetch only what lies ahead.
#include "ops.h"
#include "vec.h"

#include "quant_common.h"
#include "quant_gemm_avx2.h"
#include "quant_gemm_avx512.h"

#include <string>
#include <vector>

namespace nanoserve {

namespace {

using quant::kBlockN;
constexpr int64_t kMaxRows = 8;

bool built(const std::string& isa) {
#if defined(NANOSERVE_QUANT_AVX512)
  const bool avx512 = true;
#else
  const bool avx512 = false;
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  const bool avx2 = false;
#endif
  if (isa == "avx512") return avx512;
  if (isa == "avx2") return avx2;
  return avx512 || avx2;  // "auto"
}

}  // namespace

bool quant_gemm_available(const std::string& isa) {
  TORCH_CHECK_VALUE(isa == "auto" || isa == "avx512" || isa == "avx2", "quant_gemm: isa '", isa,
              "'; choose 'auto', 'avx512' or 'avx2'");
  return built(isa);
}

// "auto" -> the widest ISA built; a named one that is not built is refused.
std::string resolve_isa(const std::string& isa, const char* op) {
  TORCH_CHECK_VALUE(quant_gemm_available(isa), op, ": isa '", isa,
              "' is not built into these ops (this CPU or compiler lacks it)");
  if (isa != "auto") return isa;
  return built("avx512") ? "avx512" : "avx2";
}

at::Tensor pack_quant_weight(const at::Tensor& q, int64_t bits) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar,
              "pack_quant_weight: q must be (N, K) int8, got ", q.sizes(), " ", q.scalar_type());
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, "pack_quant_weight: bits must be 4 or 8, got ", bits);
  const int64_t N = q.size(0), K = q.size(1), Nb = (N + kBlockN - 1) / kBlockN;
  const at::Tensor w = q.contiguous();
  const int8_t* src = w.data_ptr<int8_t>();
  if (bits == 8) {  // (Nb, K, 32): block nb's outputs, k-major
    at::Tensor out = at::zeros({Nb, K, kBlockN}, q.options());
    int8_t* dst = out.data_ptr<int8_t>();
    at::parallel_for(0, Nb, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t nb = lo; nb < hi; ++nb)
        for (int64_t j = 0; j < kBlockN && nb * kBlockN + j < N; ++j)
          for (int64_t k = 0; k < K; ++k)
            dst[(nb * K + k) * kBlockN + j] = src[(nb * kBlockN + j) * K + k];
    });
    return out;
  }
  TORCH_CHECK_VALUE(K % 8 == 0, "pack_quant_weight: int4 needs K a multiple of 8, got q ", q.sizes());
  if (q.numel()) {
    const auto [lo, hi] = at::aminmax(w);
    TORCH_CHECK_VALUE(lo.item<int8_t>() >= -8 && hi.item<int8_t>() <= 7,
                "pack_quant_weight: int4 values must lie in [-8, 7], got [",
                int(lo.item<int8_t>()), ", ", int(hi.item<int8_t>()), "]");
  }
  // (Nb, K/8, 128) bytes: chunk c holds two 64-byte lines (outputs 0-15, 16-31); each 32-bit
  // lane is one output's nibbles, position p holding k = 8c + (p < 4 ? 2p : 2(p - 4) + 1)
  at::Tensor out = at::zeros({Nb, K / 8, 128}, q.options().dtype(at::kByte));
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, Nb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t nb = lo; nb < hi; ++nb)
      for (int64_t j = 0; j < kBlockN && nb * kBlockN + j < N; ++j) {
        const int8_t* row = src + (nb * kBlockN + j) * K;
        for (int64_t c = 0; c < K / 8; ++c) {
          uint32_t word = 0;
          for (int p = 0; p < 8; ++p) {
            const int64_t k = 8 * c + (p < 4 ? 2 * p : 2 * (p - 4) + 1);
            word |= (static_cast<uint32_t>(row[k]) & 0xFu) << (4 * p);
          }
          std::memcpy(dst + (nb * (K / 8) + c) * 128 + (j / 16) * 64 + (j % 16) * 4, &word, 4);
        }
      }
  });
  return out;
}

namespace {
using Kernel = void (*)(const qavx512::Args&);
using quant::BlockScales;
using quant::check;
}  // namespace

void quant_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                const at::Tensor& scale, const std::optional<at::Tensor>& zero, int64_t bits,
                int64_t group_size, const std::optional<at::Tensor>& bias,
                const std::string& isa_name) {
  const auto [M, K, N, Nb, G] = check("quant_gemm", out, x, packed, scale, zero, bits,
                                      group_size);
  const bool f32 = x.scalar_type() == at::kFloat;
  if (bias.has_value())
    TORCH_CHECK_VALUE(bias->numel() == N && bias->scalar_type() == x.scalar_type() &&
                    bias->is_contiguous(),
                "quant_gemm: bias must be (", N, ",) in x's dtype, got ", bias->sizes(), " ",
                bias->scalar_type());
  const std::string isa = resolve_isa(isa_name, "quant_gemm");
  if (M == 0 || N == 0) return;
  bool bf16_dp = false;
  Kernel kernels[kMaxRows] = {};
  int64_t tile = kMaxRows;
  if (isa == "avx512") {
#if defined(NANOSERVE_QUANT_AVX512)
    using namespace qavx512;
    if (bits == 8) {
      const Kernel k8[] = {int8_f32<1>, int8_f32<2>, int8_f32<3>, int8_f32<4>,
                           int8_f32<5>, int8_f32<6>, int8_f32<7>, int8_f32<8>};
      std::copy(k8, k8 + kMaxRows, kernels);
#if defined(NANOSERVE_QUANT_BF16_DP)
      if (!f32 && group_size % 2 == 0) {
        bf16_dp = true;
        const Kernel kb[] = {int8_bf16<1>, int8_bf16<2>, int8_bf16<3>, int8_bf16<4>,
                             int8_bf16<5>, int8_bf16<6>, int8_bf16<7>, int8_bf16<8>};
        std::copy(kb, kb + kMaxRows, kernels);
      }
#endif
    } else {
      const Kernel k4[] = {int4_f32<1>, int4_f32<2>, int4_f32<3>, int4_f32<4>,
                           int4_f32<5>, int4_f32<6>, int4_f32<7>, int4_f32<8>};
      std::copy(k4, k4 + kMaxRows, kernels);
#if defined(NANOSERVE_QUANT_BF16_DP)
      if (!f32) {
        bf16_dp = true;
        const Kernel kb[] = {int4_bf16<1>, int4_bf16<2>, int4_bf16<3>, int4_bf16<4>,
                             int4_bf16<5>, int4_bf16<6>, int4_bf16<7>, int4_bf16<8>};
        std::copy(kb, kb + kMaxRows, kernels);
      }
#endif
    }
#endif
  } else {
    using namespace qavx2;
    tile = kTileRows;
    const Kernel k8[] = {int8_tile<1>, int8_tile<2>, int8_tile<3>};
    const Kernel k4[] = {int4_tile<1>, int4_tile<2>, int4_tile<3>};
    std::copy(bits == 8 ? k8 : k4, (bits == 8 ? k8 : k4) + kTileRows, kernels);
  }
  // the rows transposed per tile of 8 (quant_gemm_avx512.h): float32 (T, K, 8) for the float
  // path, bf16 k-pairs (T, K/2, 8) for the dot products; and the group sums (M, G) for zeros.
  // Scratch kept per thread and grown, never shrunk: no allocation per call (slots of a tile
  // past its last row are left stale; no kernel reads them).
  const int64_t T = (M + kMaxRows - 1) / kMaxRows;
  const uint8_t* wp = static_cast<const uint8_t*>(packed.data_ptr());
  const int64_t block_bytes = packed.numel() / Nb * packed.element_size();
  // the kernels prefetch kPrefetch bytes ahead of what they read, never what they read first:
  // ask for the stream's head (and the scales') now, so memory works while the rows are copied
  for (int64_t i = 0; i < std::min<int64_t>(qavx512::kPrefetch, Nb * block_bytes); i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(wp + i), _MM_HINT_T0);
  const char* sp = static_cast<const char*>(scale.data_ptr());
  for (int64_t i = 0; i < std::min<int64_t>(1024, scale.nbytes()); i += 64)
    _mm_prefetch(sp + i, _MM_HINT_T0);
  thread_local std::vector<float> xt_buf, sx_buf;
  thread_local std::vector<int32_t> xbt_buf;
  auto grow = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  };
  float* xt = bf16_dp ? nullptr : grow(xt_buf, T * K * kMaxRows);
  int32_t* xbt = bf16_dp ? grow(xbt_buf, T * (K / 2) * kMaxRows) : nullptr;
  float* sx = zero.has_value() ? grow(sx_buf, M * G) : nullptr;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = m / kMaxRows, r = m % kMaxRows;
    if (f32) {
      const float* row = x.data_ptr<float>() + m * x.stride(0);
      if (xt)
        for (int64_t k = 0; k < K; ++k) xt[(t * K + k) * kMaxRows + r] = row[k];
      if (sx)
        for (int64_t g = 0; g < G; ++g) {
          float v = 0.f;
          for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) v += row[k];
          sx[m * G + g] = v;
        }
    } else {
      const c10::BFloat16* row = x.data_ptr<c10::BFloat16>() + m * x.stride(0);
      if (xt)
        for (int64_t k = 0; k < K; ++k) xt[(t * K + k) * kMaxRows + r] = float(row[k]);
      if (sx)
        for (int64_t g = 0; g < G; ++g) {
          float v = 0.f;
          for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) v += float(row[k]);
          sx[m * G + g] = v;
        }
      if (xbt)
        for (int64_t kk = 0; kk < K / 2; ++kk)
          std::memcpy(&xbt[(t * (K / 2) + kk) * kMaxRows + r], row + 2 * kk, 4);
    }
  }
  float* of = f32 ? out.data_ptr<float>() : nullptr;
  c10::BFloat16* ob = f32 ? nullptr : out.data_ptr<c10::BFloat16>();
  const float* bf = f32 && bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const c10::BFloat16* bb = !f32 && bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr;
  at::parallel_for(0, Nb, 4, [&](int64_t lo, int64_t hi) {
    BlockScales params(scale, zero, N, G, /*want_float=*/false);
    alignas(64) float acc[kMaxRows * kBlockN];
    for (int64_t nb = lo; nb < hi; ++nb) {
      params.load(nb);
      const int64_t n0 = nb * kBlockN, width = std::min<int64_t>(kBlockN, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        const int64_t rows = std::min<int64_t>(kMaxRows, M - m0);
        std::fill(acc, acc + rows * kBlockN, 0.f);
        for (int64_t t0 = 0; t0 < rows; t0 += tile) {
          const int64_t r = std::min<int64_t>(tile, rows - t0), m = m0 + t0;
          const int64_t t = m0 / kMaxRows;
          qavx512::Args a{xt ? xt + t * K * kMaxRows + t0 : nullptr,
                          xbt ? xbt + t * (K / 2) * kMaxRows + t0 : nullptr,
                          wp + nb * block_bytes, group_size, G, params.scale(nb),
                          params.scale16(nb), params.zero(nb), sx ? sx + m * G : nullptr,
                          acc + t0 * kBlockN};
          kernels[r - 1](a);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const float* a = acc + i * kBlockN;
          const int64_t o = (m0 + i) * N + n0;
#if defined(NANOSERVE_QUANT_BF16_DP)
          if (!f32 && width == kBlockN) {  // 32 outputs rounded by one instruction (RNE)
            qavx512::store_bf16(a, bb ? bb + n0 : nullptr, ob + o);
            continue;
          }
#endif
          if (f32)
            for (int64_t j = 0; j < width; ++j) of[o + j] = a[j] + (bf ? bf[n0 + j] : 0.f);
          else
            for (int64_t j = 0; j < width; ++j)
              ob[o + j] = c10::BFloat16(a[j] + (bb ? float(bb[n0 + j]) : 0.f));
        }
      }
    }
  });
}

}  // namespace nanoserve
