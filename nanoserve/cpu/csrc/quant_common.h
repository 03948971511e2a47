// What the quantized matmul's files share: the argument checks and a block's scales.
#pragma once

#include "vec.h"

#include <c10/util/bit_cast.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace nanoserve {
namespace quant {

constexpr int64_t kBlockN = 32;

struct Checked {
  int64_t M, K, N, Nb, G;
};

inline Checked check(const char* op, const at::Tensor& out, const at::Tensor& x,
                     const at::Tensor& packed, const at::Tensor& scale,
                     const std::optional<at::Tensor>& zero, int64_t bits, int64_t group_size) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(x.dim() == 2 && (dtype == at::kFloat || dtype == at::kBFloat16) &&
                  x.stride(1) == 1,
              op, ": x must be (M, K) float32 or bfloat16 with unit stride over K, got ",
              x.sizes(), " ", dtype);
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK_VALUE(group_size > 0 && K % group_size == 0, op, ": group_size ", group_size,
              " does not divide x's K=", K);
  TORCH_CHECK_VALUE(bits == 8 || group_size % 8 == 0, op,
              ": int4 groups must be a multiple of 8 inputs, got group_size ", group_size);
  const bool shape_ok = packed.dim() == 3 &&
      (bits == 4 ? packed.scalar_type() == at::kByte && packed.size(1) * 8 == K &&
                       packed.size(2) == 128
                 : packed.scalar_type() == at::kChar && packed.size(1) == K &&
                       packed.size(2) == kBlockN);
  TORCH_CHECK_VALUE(shape_ok && packed.is_contiguous(), op, ": packed ", packed.sizes(), " ",
              packed.scalar_type(), " is not pack_quant_weight's ", bits, "-bit layout for K=", K);
  const int64_t Nb = packed.size(0), N = out.size(1), G = K / group_size;
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == M && out.is_contiguous() &&
                  out.scalar_type() == dtype && N <= Nb * kBlockN && N > (Nb - 1) * kBlockN,
              op, ": out must be contiguous (", M, ", N) in x's dtype with N in (",
              (Nb - 1) * kBlockN, ", ", Nb * kBlockN, "], got ", out.sizes(), " ",
              out.scalar_type());
  if (scale.dim() == 3) {  // pack_scales' (Nb, G, 32) copies
    TORCH_CHECK_VALUE(scale.size(0) == Nb && scale.size(1) == G && scale.size(2) == kBlockN &&
                    (scale.scalar_type() == at::kFloat ||
                     scale.scalar_type() == at::kBFloat16) && scale.is_contiguous(),
                op, ": a packed scale must be contiguous (", Nb, ", ", G,
                ", 32) float32 or bfloat16, got ", scale.sizes(), " ", scale.scalar_type());
    if (zero.has_value())
      TORCH_CHECK_VALUE(zero->sizes() == scale.sizes() && zero->scalar_type() == at::kFloat &&
                      zero->is_contiguous(),
                  op, ": with a packed scale, zero must be packed too: (", Nb, ", ", G,
                  ", 32) float32, got ", zero->sizes(), " ", zero->scalar_type());
    return {M, K, N, Nb, G};
  }
  TORCH_CHECK_VALUE(scale.dim() == 2 && scale.size(0) == N && scale.size(1) == G &&
                  scale.is_contiguous() &&
                  (scale.scalar_type() == at::kFloat || scale.scalar_type() == at::kBFloat16),
              op, ": scale must be contiguous (", N, ", ", G, ") float32 or bfloat16, got ",
              scale.sizes(), " ", scale.scalar_type());
  if (zero.has_value())
    TORCH_CHECK_VALUE(zero->sizes() == scale.sizes() && zero->scalar_type() == at::kChar &&
                    zero->is_contiguous(),
                op, ": zero must be contiguous (", N, ", ", G, ") int8, got ", zero->sizes(),
                " ", zero->scalar_type());
  return {M, K, N, Nb, G};
}

// A block's scales and zero points as (G, 32): pointers into pack_scales' copies (bf16 ones
// handed to the kernels as they are, `scale16`, or widened into a buffer for those that want
// float32), or, from (N, G) tensors, transposed into this thread's buffers on every call (about
// one cycle a scale: a quarter of an int4 g32 block's streaming time; hence pack_scales).
class BlockScales {
 public:
  BlockScales(const at::Tensor& scale, const std::optional<at::Tensor>& zero, int64_t N,
              int64_t G, bool want_float)
      : packed_(scale.dim() == 3), has_zero_(zero.has_value()), N_(N), G_(G) {
    bf_ = scale.scalar_type() == at::kBFloat16;
    if (bf_) s16_ = reinterpret_cast<const uint16_t*>(scale.data_ptr<c10::BFloat16>());
    else s32_ = scale.data_ptr<float>();
    if (packed_) {
      zp_ = has_zero_ ? zero->data_ptr<float>() : nullptr;
      widen_ = bf_ && want_float;
      if (widen_) sc_.assign(G * kBlockN, 0.f);
      return;
    }
    z8_ = has_zero_ ? zero->data_ptr<int8_t>() : nullptr;
    sc_.assign(G * kBlockN, 0.f);
    if (has_zero_) zf_.assign(G * kBlockN, 0.f);
  }

  // float32 (G, 32), or null where scale16 gives the block's bf16 copy instead
  const float* scale(int64_t nb) const {
    if (!packed_ || widen_) return sc_.data();
    return bf_ ? nullptr : s32_ + nb * G_ * kBlockN;
  }
  const uint16_t* scale16(int64_t nb) const {
    return packed_ && bf_ && !widen_ ? s16_ + nb * G_ * kBlockN : nullptr;
  }
  const float* zero(int64_t nb) const {
    if (!has_zero_) return nullptr;
    return packed_ ? zp_ + nb * G_ * kBlockN : zf_.data();
  }

  void load(int64_t nb) {  // transpose (or widen) block nb's scales; else nothing to do
    if (packed_) {
      if (widen_)
        for (int64_t i = 0; i < G_ * kBlockN; ++i)
          sc_[i] = c10::bit_cast<float>(uint32_t(s16_[nb * G_ * kBlockN + i]) << 16);
      return;
    }
    const int64_t n0 = nb * kBlockN, width = std::min<int64_t>(kBlockN, N_ - n0);
    if (width < kBlockN) {
      std::fill(sc_.begin(), sc_.end(), 0.f);
      std::fill(zf_.begin(), zf_.end(), 0.f);
    }
    for (int64_t j = 0; j < width; ++j) {
      float* d = sc_.data() + j;
      const int64_t r = (n0 + j) * G_;
      if (bf_)
        for (int64_t g = 0; g < G_; ++g)
          d[g * kBlockN] = c10::bit_cast<float>(uint32_t(s16_[r + g]) << 16);
      else
        for (int64_t g = 0; g < G_; ++g) d[g * kBlockN] = s32_[r + g];
      if (z8_)
        for (int64_t g = 0; g < G_; ++g) zf_[g * kBlockN + j] = float(z8_[r + g]);
    }
  }

 private:
  bool packed_, has_zero_, bf_ = false, widen_ = false;
  int64_t N_, G_;
  const float* s32_ = nullptr;
  const uint16_t* s16_ = nullptr;
  const float* zp_ = nullptr;
  const int8_t* z8_ = nullptr;
  std::vector<float> sc_, zf_;
};

}  // namespace quant
}  // namespace nanoserve
