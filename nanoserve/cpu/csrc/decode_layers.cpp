// The decode step's layer loop in C++: the same ops as fused.py, in the same order, no Python
// between them.
//
// At decode size the interpreter between the ops is not free: per layer four module calls into
// PackedLinear, nine op dispatches, a dozen views and allocations, the attention backend's
// checks. For 8 rows of SmolLM2-135M's shape in bf16 on one thread of a 2-core AMD EPYC, a
// step took 13.5 ms through fused.py's loop and 11.1 ms through this one (speedpaths layers,
// paired): a sixth of the step was Python. On a GPU a CUDA graph removes that; on a CPU there is
// nothing to record, so the loop itself moves here. Each layer calls the
// functions the ops are built from (ops.h) directly, in fused.py's order (decode_layers.h holds
// the loop, shared with decode_layers_quant.cpp; here every linear is small_gemm over its
// small-M copy, plus its bias), so its result is fused.py's to the bit
// (tests/test_decode_layers.py holds them equal). It runs only where every linear takes the
// small-M kernel at this batch size and the attention is this library's paged kernel over a
// decode step's block table, each layer through its own sliding window where ``windows`` names
// one (0: none); fused.py decides, and runs its own loop everywhere else.
#include "decode_layers.h"

namespace nanoserve {

void decode_layers(at::Tensor& h, at::Tensor& residual, at::TensorList norm1,
                   at::TensorList norm2, at::TensorList qkv_w, const OptionalTensors& qkv_b,
                   at::TensorList o_w, const OptionalTensors& o_b, at::TensorList gate_up_w,
                   const OptionalTensors& gate_up_b, at::TensorList down_w,
                   const OptionalTensors& down_b, const at::Tensor& cos,
                   const at::Tensor& sin, at::Tensor& k_pools, at::Tensor& v_pools,
                   const at::Tensor& cells, const at::Tensor& block_table,
                   const at::Tensor& context_lens, int64_t block_size, int64_t num_heads,
                   int64_t num_kv_heads, int64_t intermediate, double eps, double scale,
                   at::IntArrayRef windows) {
  const LayerLoop loop{h, residual, norm1, norm2, cos, sin, k_pools, v_pools, cells,
                       block_table, context_lens, block_size, num_heads, num_kv_heads,
                       intermediate, eps, scale, windows};
  const int64_t L = check_layer_loop("decode_layers", loop);
  for (const at::TensorList& list : {qkv_w, o_w, gate_up_w, down_w})
    TORCH_CHECK(static_cast<int64_t>(list.size()) == L,
                "decode_layers: every weight list must have one entry per layer (", L, ")");
  for (const OptionalTensors* list : {&qkv_b, &o_b, &gate_up_b, &down_b})
    TORCH_CHECK(static_cast<int64_t>(list->size()) == L,
                "decode_layers: every bias list must have one entry per layer (", L, ")");
  const at::TensorList weights[kSlots] = {qkv_w, o_w, gate_up_w, down_w};
  const OptionalTensors* biases[kSlots] = {&qkv_b, &o_b, &gate_up_b, &down_b};
  run_layer_loop(loop, L, [&](at::Tensor& out, const at::Tensor& x, int64_t l, int64_t s) {
    NANOSERVE_TIMED("small_gemm", small_gemm(out, x, weights[s][l], biases[s]->get(l)))
  });
}

}  // namespace nanoserve
