// Decode attention over the paged pools: one query per row, read through the block table.
//
// The reference gathers every row's context into a (B, S) rectangle of K and V and masks it;
// the gathered path copies each row's own cells. This reads K and V where they lie: for token
// t of row b the cell is block_table[b][t / bs] * bs + t % bs, and its head h is a contiguous D
// vector there. One task is (row, KV head, split): the G = Hq / Hkv query heads that share the
// KV head are scored together (each K vector is loaded once for all G of them), scores, the
// running max and sum, and the output accumulator are float32, and the softmax is online, so
// nothing of size (B, S) exists. A long context is cut into splits of kSplit tokens run in
// parallel, each leaving (max, sum, acc) behind, combined per row at the end.
#include <algorithm>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace nanoserve {
namespace {

constexpr int64_t kSplit = 512;  // tokens per split: parallel work for few rows, long contexts
constexpr int64_t kTile = 16;    // tokens scored before one online-softmax update

static_assert(kTile % kLanes == 0, "a tile is whole registers of scores");
constexpr int64_t kMaxGD = 4096;  // G * D floats of query and accumulator kept on the stack

// s[g * kTile + j] = q[g] . k for g < G: each chunk of the K row is loaded (and widened) once and
// multiplied into all G query heads that share it.
template <typename T>
inline void dots(const float* q, const T* k, int64_t G, int64_t D, float* s, int64_t j) {
  int64_t g0 = 0;
  for (; g0 < G; g0 += 8) {  // eight heads' accumulators at a time stay in registers
    const int64_t ng = std::min<int64_t>(8, G - g0);
    fVec acc[8] = {fVec(0.f), fVec(0.f), fVec(0.f), fVec(0.f),
                   fVec(0.f), fVec(0.f), fVec(0.f), fVec(0.f)};
    int64_t d = 0;
    for (; d + kLanes <= D; d += kLanes) {
      const fVec kv = load_f(k + d);
      for (int64_t g = 0; g < ng; ++g)
        acc[g] = at::vec::fmadd(fVec::loadu(q + (g0 + g) * D + d), kv, acc[g]);
    }
    for (int64_t g = 0; g < ng; ++g) {
      float sum = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc[g]);
      for (int64_t e = d; e < D; ++e) sum += q[(g0 + g) * D + e] * to_f(k[e]);
      s[(g0 + g) * kTile + j] = sum;
    }
  }
}

// One task: row b, KV head h, tokens [t0, t1). Leaves m (G), l (G), acc (G, D).
template <typename T>
void attend_split(const T* q, const T* kpool, const T* vpool, const int64_t* blocks,
                  int64_t bs, int64_t Hkv, int64_t G, int64_t D, int64_t h, int64_t t0,
                  int64_t t1, float scale, float* m, float* l, float* acc) {
  alignas(64) float qf[kMaxGD];
  alignas(64) float s[8 * kTile * 8];  // G <= 64 heads per KV head, checked by the caller
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) qf[g * D + d] = to_f(q[g * D + d]) * scale;
  for (int64_t g = 0; g < G; ++g) m[g] = -INFINITY, l[g] = 0.f;
  std::fill(acc, acc + G * D, 0.f);
  const T* vrows[kTile];
  for (int64_t t = t0; t < t1; t += kTile) {
    const int64_t n = std::min(kTile, t1 - t);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = t + j, cell = blocks[p / bs] * bs + p % bs;
      dots(qf, kpool + (cell * Hkv + h) * D, G, D, s, j);
      vrows[j] = vpool + (cell * Hkv + h) * D;
    }
    for (int64_t g = 0; g < G; ++g) {  // online softmax: new max, rescale, weights in place
      float* sg = s + g * kTile;
      float mx = m[g];
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, sg[j]);
      for (int64_t j = n; j < kTile; ++j) sg[j] = -INFINITY;  // a short last tile weighs 0
      const fVec mv(mx);
      float sum = 0.f;
      for (int64_t j = 0; j < kTile; j += kLanes) {
        const fVec w = (fVec::loadu(sg + j) - mv).exp();
        w.store(sg + j);
        sum += at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, w);
      }
      const float alpha = std::exp(m[g] - mx);
      l[g] = l[g] * alpha + sum;
      m[g] = mx;
      if (alpha != 1.f) {
        float* a = acc + g * D;
        for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
      }
    }
    for (int64_t j = 0; j < n; ++j) {  // each V row loaded once for all G heads
      const T* v = vrows[j];
      int64_t d = 0;
      for (; d + kLanes <= D; d += kLanes) {
        const fVec vv = load_f(v + d);
        for (int64_t g = 0; g < G; ++g) {
          float* a = acc + g * D + d;
          at::vec::fmadd(fVec(s[g * kTile + j]), vv, fVec::loadu(a)).store(a);
        }
      }
      for (; d < D; ++d)
        for (int64_t g = 0; g < G; ++g) acc[g * D + d] += s[g * kTile + j] * to_f(v[d]);
    }
  }
}

}  // namespace

void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_pool,
                            const at::Tensor& v_pool, const at::Tensor& block_table,
                            const at::Tensor& context_lens, int64_t block_size, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && out.sizes() == q.sizes() &&
                  out.is_contiguous(),
              "paged_decode_attention: q and out must be contiguous (B, Hq, D), got ",
              q.sizes(), " and ", out.sizes());
  TORCH_CHECK(k_pool.dim() == 3 && k_pool.is_contiguous() && v_pool.sizes() == k_pool.sizes() &&
                  v_pool.is_contiguous() && k_pool.size(2) == q.size(2),
              "paged_decode_attention: pools must be contiguous (cells, Hkv, D), got ",
              k_pool.sizes());
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(1);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "paged_decode_attention: ", Hq,
              " query heads do not group over ", Hkv, " KV heads");
  TORCH_CHECK(Hq / Hkv <= 64 && (Hq / Hkv) * q.size(2) <= kMaxGD, "paged_decode_attention: ",
              Hq / Hkv, " query heads of ", q.size(2), " per KV head exceed the kernel's ",
              kMaxGD, "-float tile");
  TORCH_CHECK(block_table.scalar_type() == at::kLong && block_table.dim() == 2 &&
                  block_table.size(0) == B && block_table.is_contiguous(),
              "paged_decode_attention: block_table must be contiguous (B, W) int64");
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.numel() == B,
              "paged_decode_attention: context_lens must be (B,) int64");
  TORCH_CHECK(block_size >= 1, "paged_decode_attention: block_size must be >= 1");
  const auto dt = q.scalar_type();
  TORCH_CHECK(out.scalar_type() == dt && k_pool.scalar_type() == dt &&
                  v_pool.scalar_type() == dt,
              "paged_decode_attention: q, out and the pools must share a dtype");
  const int64_t G = Hq / Hkv, W = block_table.size(1), cells = k_pool.size(0);
  const at::Tensor lens_c = context_lens.contiguous();
  const int64_t* lens = lens_c.data_ptr<int64_t>();
  const int64_t* bt = block_table.data_ptr<int64_t>();
  int64_t splits = 1;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= W * block_size, "paged_decode_attention: row ", b,
                " has context ", lens[b], "; its table addresses ", W * block_size, " tokens");
    for (int64_t w = 0; w < (lens[b] + block_size - 1) / block_size; ++w)
      TORCH_CHECK(bt[b * W + w] >= 0 && (bt[b * W + w] + 1) * block_size <= cells,
                  "paged_decode_attention: row ", b, " names block ", bt[b * W + w],
                  ", outside the pool");
    splits = std::max(splits, (lens[b] + kSplit - 1) / kSplit);
  }
  // Partial results per (row, KV head, split): max and sum per query head, then G x D.
  std::vector<float> part((size_t)B * Hkv * splits * G * (D + 2));
  const int64_t stride = G * (D + 2);
  NANOSERVE_DISPATCH(dt, "paged_decode_attention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k_pool.data_ptr<scalar_t>();
    const scalar_t* vp = v_pool.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * Hkv * splits, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t task = lo; task < hi; ++task) {
        const int64_t b = task / (Hkv * splits), h = task / splits % Hkv, sp = task % splits;
        const int64_t t0 = sp * kSplit, t1 = std::min(lens[b], t0 + kSplit);
        if (t0 >= t1) continue;
        float* base = part.data() + task * stride;
        attend_split(qp + (b * Hq + h * G) * D, kp, vp, bt + b * W, block_size, Hkv, G, D, h,
                     t0, t1, (float)scale, base, base + G, base + 2 * G);
      }
    });
    at::parallel_for(0, B * Hkv, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> o(D);
      for (int64_t bh = lo; bh < hi; ++bh) {
        const int64_t b = bh / Hkv, h = bh % Hkv, used = (lens[b] + kSplit - 1) / kSplit;
        for (int64_t g = 0; g < G; ++g) {
          float M = -INFINITY, L = 0.f;
          for (int64_t sp = 0; sp < used; ++sp) M = std::max(M, part[(bh * splits + sp) * stride + g]);
          std::fill(o.begin(), o.end(), 0.f);
          for (int64_t sp = 0; sp < used; ++sp) {
            const float* base = part.data() + (bh * splits + sp) * stride;
            const float w = std::exp(base[g] - M);
            L += base[G + g] * w;
            const float* a = base + 2 * G + g * D;
            for (int64_t d = 0; d < D; ++d) o[d] += a[d] * w;
          }
          scalar_t* dst = op + (b * Hq + h * G + g) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = from_f<scalar_t>(o[d] / L);
        }
      }
    });
  });
}

}  // namespace nanoserve
