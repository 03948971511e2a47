// The schemas, under one namespace, and their CPU implementations.
//
// Every op writes into tensors it is given and returns nothing; the schema marks each written
// argument (Tensor(a!)) so that torch.compile keeps the op opaque and orders it correctly. The
// fake implementations that let the compiler trace through them live in nanoserve/csrc/ops.py.
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(nanoserve, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps) -> ()");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor x) -> ()");
  m.def("rope_and_cache(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor cos, Tensor sin, "
        "Tensor(c!) k_pool, Tensor(d!) v_pool, Tensor cells) -> ()");
  m.def("paged_decode_attention(Tensor(a!) out, Tensor q, Tensor k_pool, Tensor v_pool, "
        "Tensor block_table, Tensor context_lens, int block_size, float scale, "
        "int window=0) -> ()");
  m.def("argmax_rows(Tensor(a!) out, Tensor logits) -> ()");
  m.def("apply_token_bitmask(Tensor(a!) logits, Tensor rows, Tensor words) -> ()");
  m.def("small_gemm_available() -> bool");
  m.def("small_gemm_f32_available() -> bool");
  m.def("pack_small_gemm(Tensor weight) -> Tensor");
  m.def("small_gemm(Tensor(a!) out, Tensor x, Tensor packed, Tensor? bias) -> ()");
  m.def("quant_gemm_available(str isa) -> bool");
  m.def("pack_quant_weight(Tensor q, int bits) -> Tensor");
  m.def("quant_gemm(Tensor(a!) out, Tensor x, Tensor packed, Tensor scale, Tensor? zero, "
        "int bits, int group_size, Tensor? bias, str isa) -> ()");
  m.def("dequantize_into(Tensor(a!) buf, Tensor packed, Tensor scale, Tensor? zero, int bits, "
        "int group_size) -> ()");
  m.def("pack_int8_weight(Tensor q) -> Tensor");
  m.def("int8_gemm(Tensor(a!) out, Tensor x, Tensor packed, Tensor w_scale, Tensor? bias, "
        "str isa) -> ()");
  m.def("bind_threads(int[] cpus) -> int[]");
  m.def("decode_layers(Tensor(a!) h, Tensor(b!) residual, Tensor[] norm1, Tensor[] norm2, "
        "Tensor[] qkv_w, Tensor?[] qkv_b, Tensor[] o_w, Tensor?[] o_b, Tensor[] gate_up_w, "
        "Tensor?[] gate_up_b, Tensor[] down_w, Tensor?[] down_b, Tensor cos, Tensor sin, "
        "Tensor(c!) k_pools, Tensor(d!) v_pools, Tensor cells, Tensor block_table, "
        "Tensor context_lens, int block_size, int num_heads, int num_kv_heads, "
        "int intermediate, float eps, float scale, int[] windows=[]) -> ()");
  m.def("decode_layers_quant(Tensor(a!) h, Tensor(b!) residual, Tensor[] norm1, "
        "Tensor[] norm2, Tensor[] packed, Tensor[] w_scale, Tensor?[] w_zero, Tensor?[] bias, "
        "int[] bits, int[] group_size, int[] act_bits, Tensor cos, Tensor sin, "
        "Tensor(c!) k_pools, Tensor(d!) v_pools, Tensor cells, Tensor block_table, "
        "Tensor context_lens, int block_size, int num_heads, int num_kv_heads, "
        "int intermediate, float eps, float scale, int[] windows=[]) -> ()");
}

TORCH_LIBRARY_IMPL(nanoserve, CPU, m) {
  m.impl("rms_norm", &nanoserve::rms_norm);
  m.impl("fused_add_rms_norm", &nanoserve::fused_add_rms_norm);
  m.impl("silu_and_mul", &nanoserve::silu_and_mul);
  m.impl("rope_and_cache", &nanoserve::rope_and_cache);
  m.impl("paged_decode_attention", &nanoserve::paged_decode_attention);
  m.impl("apply_token_bitmask", &nanoserve::apply_token_bitmask);
  m.impl("argmax_rows", &nanoserve::argmax_rows);
  m.impl("pack_small_gemm", &nanoserve::pack_small_gemm);
  m.impl("small_gemm", &nanoserve::small_gemm);
  m.impl("decode_layers", &nanoserve::decode_layers);
  m.impl("decode_layers_quant", &nanoserve::decode_layers_quant);
  m.impl("pack_quant_weight", &nanoserve::pack_quant_weight);
  m.impl("quant_gemm", &nanoserve::quant_gemm);
  m.impl("dequantize_into", &nanoserve::dequantize_into);
  m.impl("pack_int8_weight", &nanoserve::pack_int8_weight);
  m.impl("int8_gemm", &nanoserve::int8_gemm);
}

TORCH_LIBRARY_IMPL(nanoserve, CompositeExplicitAutograd, m) {
  m.impl("small_gemm_available", &nanoserve::small_gemm_available);
  m.impl("small_gemm_f32_available", &nanoserve::small_gemm_f32_available);
  m.impl("bind_threads", &nanoserve::bind_threads);
  m.impl("quant_gemm_available", &nanoserve::quant_gemm_available);
}
