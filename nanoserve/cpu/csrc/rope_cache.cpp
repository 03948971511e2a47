// RoPE on the step's queries and keys, fused with writing keys and values into the paged pools.
//
// Unfused, RoPE builds x * cos, the rotated half (a cat of two slices and a negation) and
// their sum for q and for k, and then the cache write copies k and v once more through
// index_copy_. Here each token's heads are rotated in place and its k and v land in their pool
// cell in the same pass. cos and sin are the model's own (N, D) table (Hugging Face's layout:
// the D/2 angles twice), so any rope scaling computed in Python keeps working. A cell < 0 is a
// padding token: rotated, not written.
#include "ops.h"
#include "vec.h"

namespace nanoserve {
namespace {

// x (D) at one head, rotated in place: x_i cos_i - x_{i+h} sin_i for i < h, and
// x_i cos_i + x_{i-h} sin_i above, with each product and the sum rounded like the reference.
template <typename T>
void rotate(T* x, const T* c, const T* s, int64_t D) {
  const int64_t h = D / 2;
  int64_t i = 0;
  for (; i + kLanes <= h; i += kLanes) {
    fVec x1 = load_f(x + i), x2 = load_f(x + h + i);
    fVec c1 = load_f(c + i), c2 = load_f(c + h + i);
    fVec s1 = load_f(s + i), s2 = load_f(s + h + i);
    fVec lo = round_to<T>(x1 * c1) + round_to<T>(x2.neg() * s1);
    fVec hi = round_to<T>(x2 * c2) + round_to<T>(x1 * s2);
    store_f(x + i, lo);
    store_f(x + h + i, hi);
  }
  for (; i < h; ++i) {
    float x1 = to_f(x[i]), x2 = to_f(x[h + i]);
    float lo = round_to<T>(x1 * to_f(c[i])) + round_to<T>(-x2 * to_f(s[i]));
    float hi = round_to<T>(x2 * to_f(c[h + i])) + round_to<T>(x1 * to_f(s[h + i]));
    x[i] = from_f<T>(lo);
    x[h + i] = from_f<T>(hi);
  }
}

template <typename T>
void copy_row(T* dst, const T* src, int64_t D) {
  std::memcpy(dst, src, D * sizeof(T));
}

void check_heads(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "rope_and_cache: ", name, " is not on the CPU");
  TORCH_CHECK(t.dim() == 3 && t.stride(2) == 1, "rope_and_cache: ", name,
              " must be (N, H, D) with unit stride over D, got sizes ", t.sizes(),
              " strides ", t.strides());
}

}  // namespace

void rope_and_cache(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                    const at::Tensor& sin, at::Tensor& k_pool, at::Tensor& v_pool,
                    const at::Tensor& cells) {
  check_heads(q, "q");
  check_heads(k, "k");
  check_heads(v, "v");
  const int64_t N = q.size(0), Hq = q.size(1), Hkv = k.size(1), D = q.size(2);
  TORCH_CHECK(D % 2 == 0, "rope_and_cache: head_dim must be even, got ", D);
  TORCH_CHECK(k.size(0) == N && v.size(0) == N && k.size(2) == D && v.sizes() == k.sizes(),
              "rope_and_cache: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
              " do not describe the same tokens");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 &&
                  cos.size(0) == N && cos.size(1) == D && sin.sizes() == cos.sizes(),
              "rope_and_cache: cos and sin must be contiguous (N, D), got ", cos.sizes());
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 3 &&
                  k_pool.size(1) == Hkv && k_pool.size(2) == D &&
                  v_pool.sizes() == k_pool.sizes(),
              "rope_and_cache: pools must be contiguous (cells, Hkv, D), got ", k_pool.sizes());
  TORCH_CHECK(cells.scalar_type() == at::kLong && cells.is_contiguous() && cells.numel() == N,
              "rope_and_cache: cells must be N int64 cells");
  const auto dt = q.scalar_type();
  TORCH_CHECK(k.scalar_type() == dt && v.scalar_type() == dt && cos.scalar_type() == dt &&
                  sin.scalar_type() == dt && k_pool.scalar_type() == dt &&
                  v_pool.scalar_type() == dt,
              "rope_and_cache: every tensor must share q's dtype ", dt);
  const int64_t num_cells = k_pool.size(0);
  const int64_t* cp = cells.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n)
    TORCH_CHECK(cp[n] < num_cells, "rope_and_cache: cell ", cp[n], " is past the pool's ",
                num_cells);
  NANOSERVE_DISPATCH(dt, "rope_and_cache", [&] {
    scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* cosp = cos.data_ptr<scalar_t>();
    const scalar_t* sinp = sin.data_ptr<scalar_t>();
    scalar_t* kpool = k_pool.data_ptr<scalar_t>();
    scalar_t* vpool = v_pool.data_ptr<scalar_t>();
    const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = k.stride(0), ks1 = k.stride(1);
    const int64_t vs0 = v.stride(0), vs1 = v.stride(1);
    at::parallel_for(0, N, std::max<int64_t>(1, 4096 / ((Hq + Hkv) * D)),
                     [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const scalar_t* c = cosp + n * D;
        const scalar_t* s = sinp + n * D;
        for (int64_t h = 0; h < Hq; ++h) rotate(qp + n * qs0 + h * qs1, c, s, D);
        for (int64_t h = 0; h < Hkv; ++h) {
          scalar_t* kh = kp + n * ks0 + h * ks1;
          rotate(kh, c, s, D);
          if (cp[n] >= 0) {
            copy_row(kpool + (cp[n] * Hkv + h) * D, kh, D);
            copy_row(vpool + (cp[n] * Hkv + h) * D, vp + n * vs0 + h * vs1, D);
          }
        }
      }
    });
  });
}

}  // namespace nanoserve
