// SiLU-and-multiply: (N, 2I) -> (N, I), gate in the first half, up in the second.
//
// The unfused MLP makes three tensors of (N, I) between the two matmuls (silu(gate), the
// product, and the split views' copies); this writes the product straight into its output.
// Rounding follows the reference: silu rounded to the storage dtype, then the product.
#include "ops.h"
#include "vec.h"

namespace nanoserve {

void silu_and_mul(at::Tensor& out, const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "silu_and_mul: a CPU op");
  TORCH_CHECK(x.is_contiguous() && out.is_contiguous(), "silu_and_mul: contiguous tensors only");
  TORCH_CHECK(x.size(-1) % 2 == 0 && out.size(-1) * 2 == x.size(-1) &&
                  out.numel() * 2 == x.numel(),
              "silu_and_mul: out must be x's shape with the last dim halved");
  TORCH_CHECK(x.scalar_type() == out.scalar_type(), "silu_and_mul: dtypes differ");
  const int64_t I = out.size(-1), N = out.numel() / std::max<int64_t>(I, 1);
  NANOSERVE_DISPATCH(x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const fVec one(1.f);
    at::parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(I, 1)),
                     [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const scalar_t* g = xp + n * 2 * I;
        const scalar_t* u = g + I;
        scalar_t* o = op + n * I;
        int64_t i = 0;
        for (; i + kLanes <= I; i += kLanes) {
          fVec gv = load_f(g + i);
          fVec s = round_to<scalar_t>(gv / (one + gv.neg().exp()));
          store_f(o + i, s * load_f(u + i));
        }
        for (; i < I; ++i) {
          float gv = to_f(g[i]);
          float s = round_to<scalar_t>(gv / (1.f + std::exp(-gv)));
          o[i] = from_f<scalar_t>(s * to_f(u[i]));
        }
      }
    });
  });
}

}  // namespace nanoserve
