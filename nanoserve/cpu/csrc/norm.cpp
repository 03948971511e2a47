// RMSNorm, and the residual add fused into it: one pass over each row, no float32 copy of x.
//
// The unfused model reads and writes the hidden state four times per norm (the cast up, the
// square and mean, the scale, the cast down, then the weight) and the residual add once more.
// Here a row is loaded once in its storage dtype, widened in registers, reduced in float32,
// and written once. Rounding follows Hugging Face's LlamaRMSNorm: the normalised row is rounded
// to the storage dtype, then multiplied by the weight and rounded again (in float32 both are
// no-ops, so float32 differs from the reference only in the order of the sum of squares).
#include "ops.h"
#include "vec.h"

namespace nanoserve {
namespace {

template <typename T>
void norm_row(T* out, const T* x, const T* w, int64_t E, float eps) {
  fVec acc(0.f);
  int64_t i = 0;
  for (; i + kLanes <= E; i += kLanes) {
    fVec v = load_f(x + i);
    acc = at::vec::fmadd(v, v, acc);
  }
  float ss = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc);
  for (; i < E; ++i) ss += to_f(x[i]) * to_f(x[i]);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(E) + eps);
  const fVec rv(r);
  i = 0;
  for (; i + kLanes <= E; i += kLanes) {
    fVec y = round_to<T>(load_f(x + i) * rv);
    store_f(out + i, load_f(w + i) * y);
  }
  for (; i < E; ++i) out[i] = from_f<T>(to_f(w[i]) * round_to<T>(to_f(x[i]) * r));
}

void check_rows(const at::Tensor& t, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, ": a CPU op, got a tensor on ", t.device());
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) == weight.size(0), name, ": last dim ", t.size(-1),
              " does not match the weight's ", weight.size(0));
  TORCH_CHECK(t.is_contiguous() && weight.is_contiguous(), name, ": contiguous tensors only");
  TORCH_CHECK(t.scalar_type() == weight.scalar_type(), name, ": x is ", t.scalar_type(),
              ", weight is ", weight.scalar_type());
}

int64_t grain(int64_t E) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(E, 1)); }

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "rms_norm");
  check_rows(out, weight, "rms_norm");
  TORCH_CHECK(out.sizes() == x.sizes(), "rms_norm: out and x differ in shape");
  const int64_t E = x.size(-1), N = x.numel() / E;
  NANOSERVE_DISPATCH(x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, N, grain(E), [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) norm_row(op + n * E, xp + n * E, wp, E, (float)eps);
    });
  });
}

void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                        double eps) {
  check_rows(x, weight, "fused_add_rms_norm");
  check_rows(residual, weight, "fused_add_rms_norm");
  TORCH_CHECK(residual.sizes() == x.sizes(), "fused_add_rms_norm: x and residual differ");
  const int64_t E = x.size(-1), N = x.numel() / E;
  NANOSERVE_DISPATCH(x.scalar_type(), "fused_add_rms_norm", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    at::parallel_for(0, N, grain(E), [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        scalar_t* xr = xp + n * E;
        scalar_t* rr = rp + n * E;
        int64_t i = 0;  // residual <- residual + x, rounded as the reference's add rounds
        for (; i + kLanes <= E; i += kLanes) store_f(rr + i, load_f(rr + i) + load_f(xr + i));
        for (; i < E; ++i) rr[i] = from_f<scalar_t>(to_f(rr[i]) + to_f(xr[i]));
        norm_row(xr, rr, wp, E, (float)eps);  // x <- norm(residual)
      }
    });
  });
}

}  // namespace nanoserve
