// The decode step's layer loop, shared by its two ops: decode_layers (every linear a small-M
// copy, decode_layers.cpp) and decode_layers_quant (every linear a quantized weight,
// decode_layers_quant.cpp). They differ only in how "linear s of layer l" runs, which each
// passes in as a functor; the norms, RoPE, the cache writes and the attention are this one
// loop, so both compute what fused.py's own loop computes, in its order:
//
//   l == 0: h = rms_norm(residual)            l > 0: residual += h; h = rms_norm(residual)
//   qkv = linear(h, qkv)                      rope_and_cache(q, k, v -> the pools at cells)
//   a = paged_decode_attention(q)             h = linear(a, o)
//   residual += h; h = rms_norm(residual)     h = linear(silu_and_mul(linear(h, gate_up)), down)
#pragma once

#include <ATen/record_function.h>

#include "ops.h"

namespace nanoserve {

// Each call inside the loop under its own op's name, so torch.profiler splits the loop's time
// as it would fused.py's (the guard costs a flag test while no profiler runs).
#define NANOSERVE_TIMED(name, ...)                                    \
  {                                                                   \
    RECORD_FUNCTION("nanoserve::" name, std::vector<c10::IValue>());  \
    __VA_ARGS__;                                                      \
  }

// The linears' slots within a layer, in the order they run.
enum LinearSlot : int64_t { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kSlots = 4 };

// What the loop needs besides the linears: the stream, the norms, the cache and its table.
struct LayerLoop {
  at::Tensor& h;         // (B, E): the hidden state, written
  at::Tensor& residual;  // (B, E): the residual stream, updated in place
  at::TensorList norm1, norm2;
  const at::Tensor &cos, &sin;
  at::Tensor &k_pools, &v_pools;  // (L, cells, Hkv, D)
  const at::Tensor &cells, &block_table, &context_lens;
  int64_t block_size, num_heads, num_kv_heads, intermediate;
  double eps, scale;
  at::IntArrayRef windows;
};

// The checks both ops make on the loop's own arguments; returns the number of layers.
inline int64_t check_layer_loop(const char* op, const LayerLoop& a) {
  const int64_t L = static_cast<int64_t>(a.norm1.size());
  TORCH_CHECK(static_cast<int64_t>(a.norm2.size()) == L, op,
              ": every weight list must have one entry per layer (", L, ")");
  TORCH_CHECK(a.h.dim() == 2 && a.h.is_contiguous() && a.residual.sizes() == a.h.sizes() &&
                  a.residual.is_contiguous(),
              op, ": h and residual must be contiguous (B, E), got ", a.h.sizes(), " and ",
              a.residual.sizes());
  TORCH_CHECK(a.k_pools.dim() == 4 && a.k_pools.size(0) == L &&
                  a.v_pools.sizes() == a.k_pools.sizes(),
              op, ": pools must be (L, cells, Hkv, D) with L = ", L);
  TORCH_CHECK(a.windows.empty() || static_cast<int64_t>(a.windows.size()) == L, op,
              ": windows must be empty or one per layer (", L, "), got ", a.windows.size());
  TORCH_CHECK(a.k_pools.size(2) == a.num_kv_heads, op, ": the pools hold ", a.k_pools.size(2),
              " KV heads, not ", a.num_kv_heads);
  return L;
}

// Runs the loop; linear(out, x, l, slot) writes linear `slot` of layer l applied to x into
// out (both contiguous 2-D). The buffers for qkv, q, the attention output, gate_up and the
// activation are allocated once per call, not once per layer.
template <class Linear>
void run_layer_loop(const LayerLoop& a, int64_t L, Linear&& linear) {
  at::Tensor& h = a.h;
  at::Tensor& residual = a.residual;
  const int64_t B = h.size(0), Hq = a.num_heads, Hkv = a.num_kv_heads, D = a.k_pools.size(3);
  const int64_t I = a.intermediate;
  const auto opts = h.options();
  at::Tensor qkv = at::empty({B, (Hq + 2 * Hkv) * D}, opts);  // (B, (Hq + 2 Hkv) D)
  at::Tensor q = at::empty({B, Hq, D}, opts);                   // the kernel's contiguous q
  at::Tensor attn = at::empty({B, Hq, D}, opts);
  at::Tensor gate_up = at::empty({B, 2 * I}, opts);  // (B, 2I)
  at::Tensor act = at::empty({B, I}, opts);          // (B, I)
  // Views into qkv, as fused.py makes them: rotated in place, k and v written to the pools.
  at::Tensor q_in = qkv.narrow(1, 0, Hq * D).view({B, Hq, D});
  at::Tensor k_in = qkv.narrow(1, Hq * D, Hkv * D).view({B, Hkv, D});
  at::Tensor v_in = qkv.narrow(1, (Hq + Hkv) * D, Hkv * D).view({B, Hkv, D});
  at::Tensor attn_2d = attn.view({B, Hq * D});
  for (int64_t l = 0; l < L; ++l) {
    if (l == 0)
      NANOSERVE_TIMED("rms_norm", rms_norm(h, residual, a.norm1[0], a.eps))
    else
      NANOSERVE_TIMED("fused_add_rms_norm", fused_add_rms_norm(h, residual, a.norm1[l], a.eps))
    linear(qkv, h, l, kQkv);
    at::Tensor kp = a.k_pools.select(0, l), vp = a.v_pools.select(0, l);
    NANOSERVE_TIMED("rope_and_cache",
                    rope_and_cache(q_in, k_in, v_in, a.cos, a.sin, kp, vp, a.cells))
    NANOSERVE_TIMED("paged_decode_attention", q.copy_(q_in);
                    paged_decode_attention(attn, q, kp, vp, a.block_table, a.context_lens,
                                           a.block_size, a.scale,
                                           a.windows.empty() ? 0 : a.windows[l]))
    linear(h, attn_2d, l, kO);
    NANOSERVE_TIMED("fused_add_rms_norm", fused_add_rms_norm(h, residual, a.norm2[l], a.eps))
    linear(gate_up, h, l, kGateUp);
    NANOSERVE_TIMED("silu_and_mul", silu_and_mul(act, gate_up))
    linear(h, act, l, kDown);
  }
}

}  // namespace nanoserve
