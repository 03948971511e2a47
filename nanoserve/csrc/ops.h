// The ops this library registers under torch.ops.nanoserve (registry.cpp), one file each.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace nanoserve {

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                        double eps);
void silu_and_mul(at::Tensor& out, const at::Tensor& x);
void rope_and_cache(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                    const at::Tensor& sin, at::Tensor& k_pool, at::Tensor& v_pool,
                    const at::Tensor& cells);
void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_pool,
                            const at::Tensor& v_pool, const at::Tensor& block_table,
                            const at::Tensor& context_lens, int64_t block_size, double scale);

void argmax_rows(at::Tensor& out, const at::Tensor& logits);

void apply_token_bitmask(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& words);

bool small_gemm_available();
bool small_gemm_f32_available();
at::Tensor pack_small_gemm(const at::Tensor& weight);
void small_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                const std::optional<at::Tensor>& bias);

std::vector<int64_t> bind_threads(const std::vector<int64_t>& cpus);

}  // namespace nanoserve
