// The ops this library registers under torch.ops.nanoserve (registry.cpp), one file each.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
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
                            const at::Tensor& context_lens, int64_t block_size, double scale,
                            int64_t window = 0);

void argmax_rows(at::Tensor& out, const at::Tensor& logits);

void apply_token_bitmask(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& words);

bool small_gemm_available();
bool small_gemm_f32_available();
at::Tensor pack_small_gemm(const at::Tensor& weight);
void small_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                const std::optional<at::Tensor>& bias);

bool quant_gemm_available(const std::string& isa);
at::Tensor pack_quant_weight(const at::Tensor& q, int64_t bits);
void quant_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                const at::Tensor& scale, const std::optional<at::Tensor>& zero, int64_t bits,
                int64_t group_size, const std::optional<at::Tensor>& bias,
                const std::string& isa);
void dequantize_into(at::Tensor& buf, const at::Tensor& packed, const at::Tensor& scale,
                     const std::optional<at::Tensor>& zero, int64_t bits, int64_t group_size);
at::Tensor pack_int8_weight(const at::Tensor& q);
void int8_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
               const at::Tensor& w_scale, const std::optional<at::Tensor>& bias,
               const std::string& isa);

using OptionalTensors = c10::List<std::optional<at::Tensor>>;
void decode_layers(at::Tensor& h, at::Tensor& residual, at::TensorList norm1,
                   at::TensorList norm2, at::TensorList qkv_w, const OptionalTensors& qkv_b,
                   at::TensorList o_w, const OptionalTensors& o_b, at::TensorList gate_up_w,
                   const OptionalTensors& gate_up_b, at::TensorList down_w,
                   const OptionalTensors& down_b, const at::Tensor& cos, const at::Tensor& sin,
                   at::Tensor& k_pools, at::Tensor& v_pools, const at::Tensor& cells,
                   const at::Tensor& block_table, const at::Tensor& context_lens,
                   int64_t block_size, int64_t num_heads, int64_t num_kv_heads,
                   int64_t intermediate, double eps, double scale, at::IntArrayRef windows);
void decode_layers_quant(at::Tensor& h, at::Tensor& residual, at::TensorList norm1,
                         at::TensorList norm2, at::TensorList packed, at::TensorList w_scale,
                         const OptionalTensors& w_zero, const OptionalTensors& bias,
                         at::IntArrayRef bits, at::IntArrayRef group_size,
                         at::IntArrayRef act_bits, const at::Tensor& cos, const at::Tensor& sin,
                         at::Tensor& k_pools, at::Tensor& v_pools, const at::Tensor& cells,
                         const at::Tensor& block_table, const at::Tensor& context_lens,
                         int64_t block_size, int64_t num_heads, int64_t num_kv_heads,
                         int64_t intermediate, double eps, double scale,
                         at::IntArrayRef windows);

std::vector<int64_t> bind_threads(const std::vector<int64_t>& cpus);

}  // namespace nanoserve
