// The decode step's layer loop as one op for a quantized model: decode_layers' loop
// (decode_layers.h) with every linear through the quantized kernels, no Python between them.
//
// Through fused.py's own loop, a quantized model's decode step paid for the interpreter around
// every linear (QuantKernelLinear.run's checks, the wrapper's empty and reshape, the module
// calls): SmolLM2-135M's shape, bf16 rows, one thread of a 2-core AMD EPYC (Zen 5), one
// request, paired rounds in one process, this op against that loop: w4a16 g32 233 against 156
// tok/s (1.49x), w8a16 g32 173 against 115 (1.51x), w8a8 180 against 132 (1.36x); bf16's
// decode_layers 128 against 104 (1.23x) (a shared machine: best of 4 rounds). Here each linear
// is the call QuantKernelLinear.run makes at decode size, with the same arguments:
//
//   weight-only (act_bits 0): quant_gemm(out, x, packed, scale, zero, bits, group_size, bias)
//   W8A8 (act_bits 8):        int8_gemm(out, x, packed, scale, bias)
//
// both with isa "auto", so its result is fused.py's loop's to the bit
// (tests/test_decode_layers_quant.py holds them equal). The weights come as flat lists, one
// entry per linear in the order the loop runs them (layer l's qkv, o, gate_up, down at 4l..4l+3),
// with each linear's bits, group size and activation bits; fused.py decides when it qualifies
// (every linear a QuantKernelLinear whose kernel takes the batch, no act order).
#include "decode_layers.h"

#include <string>

namespace nanoserve {

void decode_layers_quant(at::Tensor& h, at::Tensor& residual, at::TensorList norm1,
                         at::TensorList norm2, at::TensorList packed, at::TensorList w_scale,
                         const OptionalTensors& w_zero, const OptionalTensors& bias,
                         at::IntArrayRef bits, at::IntArrayRef group_size,
                         at::IntArrayRef act_bits, const at::Tensor& cos, const at::Tensor& sin,
                         at::Tensor& k_pools, at::Tensor& v_pools, const at::Tensor& cells,
                         const at::Tensor& block_table, const at::Tensor& context_lens,
                         int64_t block_size, int64_t num_heads, int64_t num_kv_heads,
                         int64_t intermediate, double eps, double scale,
                         at::IntArrayRef windows) {
  const LayerLoop loop{h, residual, norm1, norm2, cos, sin, k_pools, v_pools, cells,
                       block_table, context_lens, block_size, num_heads, num_kv_heads,
                       intermediate, eps, scale, windows};
  const int64_t L = check_layer_loop("decode_layers_quant", loop), n = kSlots * L;
  const int64_t sizes[] = {static_cast<int64_t>(packed.size()),
                           static_cast<int64_t>(w_scale.size()),
                           static_cast<int64_t>(w_zero.size()),
                           static_cast<int64_t>(bias.size()),
                           static_cast<int64_t>(bits.size()),
                           static_cast<int64_t>(group_size.size()),
                           static_cast<int64_t>(act_bits.size())};
  for (const int64_t size : sizes)
    TORCH_CHECK(size == n, "decode_layers_quant: every per-linear list must have ", kSlots,
                " entries per layer (", n, " for ", L, " layers), got ", size);
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK((act_bits[i] == 0 && (bits[i] == 4 || bits[i] == 8)) ||
                    (act_bits[i] == 8 && bits[i] == 8),
                "decode_layers_quant: linear ", i, " (layer ", i / kSlots, ") has bits ",
                bits[i], " and act_bits ", act_bits[i],
                "; the kernels take weight-only int4/int8 (act_bits 0) or W8A8 (8 and 8)");
  static const std::string kAuto = "auto";  // QuantKernelLinear's isa; one string, not one a call
  run_layer_loop(loop, L, [&](at::Tensor& out, const at::Tensor& x, int64_t l, int64_t s) {
    const int64_t i = kSlots * l + s;
    if (act_bits[i] == 0)
      NANOSERVE_TIMED("quant_gemm", quant_gemm(out, x, packed[i], w_scale[i], w_zero.get(i),
                                               bits[i], group_size[i], bias.get(i), kAuto))
    else
      NANOSERVE_TIMED("int8_gemm", int8_gemm(out, x, packed[i], w_scale[i], bias.get(i), kAuto))
  });
}

}  // namespace nanoserve
