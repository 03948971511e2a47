// The decode step's layer loop in C++: the same ops as fused.py, in the same order, no Python
// between them.
//
// At decode size the interpreter between the ops is not free: per layer four module calls into
// PackedLinear, nine op dispatches, a dozen views and allocations, the attention backend's
// checks. For 8 rows of SmolLM2-135M's shape in bf16 on one thread of a 2-core AMD EPYC, a
// step took 13.5 ms through fused.py's loop and 11.1 ms through this one (speedpaths layers,
// paired): a sixth of the step was Python. On a GPU a CUDA graph removes that; on a CPU there is
// nothing to record, so the loop itself moves here. Each layer calls the
// functions the ops are built from (ops.h) directly:
//
//   l == 0: h = rms_norm(residual)            l > 0: residual += h; h = rms_norm(residual)
//   qkv = small_gemm(h, Wqkv) (+ bias)        rope_and_cache(q, k, v -> the pools at cells)
//   a = paged_decode_attention(q)             h = small_gemm(a, Wo) (+ bias)
//   residual += h; h = rms_norm(residual)     h = small_gemm(silu_and_mul(small_gemm(h, Wgu)), Wd)
//
// so its result is fused.py's to the bit (tests/test_decode_layers.py holds them equal). It
// runs only where every linear takes the small-M kernel at this batch size and the attention is
// this library's paged kernel over a decode step's block table, each layer through its own
// sliding window where ``windows`` names one (0: none); fused.py decides, and runs its
// own loop everywhere else. The buffers for q, the attention output, gate_up and the activation
// are allocated once per call, not once per layer.
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
  const int64_t L = static_cast<int64_t>(norm1.size());
  for (const at::TensorList& list : {norm2, qkv_w, o_w, gate_up_w, down_w})
    TORCH_CHECK(static_cast<int64_t>(list.size()) == L,
                "decode_layers: every weight list must have one entry per layer (", L, ")");
  for (const OptionalTensors* list : {&qkv_b, &o_b, &gate_up_b, &down_b})
    TORCH_CHECK(static_cast<int64_t>(list->size()) == L,
                "decode_layers: every bias list must have one entry per layer (", L, ")");
  TORCH_CHECK(h.dim() == 2 && h.is_contiguous() && residual.sizes() == h.sizes() &&
                  residual.is_contiguous(),
              "decode_layers: h and residual must be contiguous (B, E), got ", h.sizes(),
              " and ", residual.sizes());
  TORCH_CHECK(k_pools.dim() == 4 && k_pools.size(0) == L && v_pools.sizes() == k_pools.sizes(),
              "decode_layers: pools must be (L, cells, Hkv, D) with L = ", L);
  TORCH_CHECK(windows.empty() || static_cast<int64_t>(windows.size()) == L,
              "decode_layers: windows must be empty or one per layer (", L, "), got ",
              windows.size());
  const int64_t B = h.size(0), Hq = num_heads, Hkv = num_kv_heads, D = k_pools.size(3);
  TORCH_CHECK(k_pools.size(2) == Hkv, "decode_layers: the pools hold ", k_pools.size(2),
              " KV heads, not ", Hkv);
  const auto opts = h.options();
  at::Tensor qkv = at::empty({B, (Hq + 2 * Hkv) * D}, opts);  // (B, (Hq + 2 Hkv) D)
  at::Tensor q = at::empty({B, Hq, D}, opts);                   // the kernel's contiguous q
  at::Tensor attn = at::empty({B, Hq, D}, opts);
  at::Tensor gate_up = at::empty({B, 2 * intermediate}, opts);  // (B, 2I)
  at::Tensor act = at::empty({B, intermediate}, opts);          // (B, I)
  // Views into qkv, as fused.py makes them: rotated in place, k and v written to the pools.
  at::Tensor q_in = qkv.narrow(1, 0, Hq * D).view({B, Hq, D});
  at::Tensor k_in = qkv.narrow(1, Hq * D, Hkv * D).view({B, Hkv, D});
  at::Tensor v_in = qkv.narrow(1, (Hq + Hkv) * D, Hkv * D).view({B, Hkv, D});
  at::Tensor attn_2d = attn.view({B, Hq * D});
  for (int64_t l = 0; l < L; ++l) {
    if (l == 0)
      NANOSERVE_TIMED("rms_norm", rms_norm(h, residual, norm1[0], eps))
    else
      NANOSERVE_TIMED("fused_add_rms_norm", fused_add_rms_norm(h, residual, norm1[l], eps))
    NANOSERVE_TIMED("small_gemm", small_gemm(qkv, h, qkv_w[l], qkv_b.get(l)))
    at::Tensor kp = k_pools.select(0, l), vp = v_pools.select(0, l);
    NANOSERVE_TIMED("rope_and_cache", rope_and_cache(q_in, k_in, v_in, cos, sin, kp, vp, cells))
    NANOSERVE_TIMED("paged_decode_attention", q.copy_(q_in);
                    paged_decode_attention(attn, q, kp, vp, block_table, context_lens,
                                           block_size, scale,
                                           windows.empty() ? 0 : windows[l]))
    NANOSERVE_TIMED("small_gemm", small_gemm(h, attn_2d, o_w[l], o_b.get(l)))
    NANOSERVE_TIMED("fused_add_rms_norm", fused_add_rms_norm(h, residual, norm2[l], eps))
    NANOSERVE_TIMED("small_gemm", small_gemm(gate_up, h, gate_up_w[l], gate_up_b.get(l)))
    NANOSERVE_TIMED("silu_and_mul", silu_and_mul(act, gate_up))
    NANOSERVE_TIMED("small_gemm", small_gemm(h, act, down_w[l], down_b.get(l)))
  }
}

}  // namespace nanoserve
