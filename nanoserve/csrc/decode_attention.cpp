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
//
// In the engine the pools are cold: between two layers' reads the weights stream through the
// cache. So a task prefetches the next tile's K and V vectors before it scores the current one,
// and its inner loops keep accumulators in registers (per head and key while scoring, per head
// and D-chunk across a tile while weighing V). Day 55's snapshot is the version without these;
// every sum runs in the same order in both, and their outputs are equal to the bit.
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

// The per-head accumulators below are arrays of NG registers; NG is a template argument, 1 to 8,
// so that the compiler keeps them in registers. HEADS(n, call) runs call with NG = n.
#define NANOSERVE_HEADS(n, ...)                 \
  switch (n) {                                  \
    case 1: { constexpr int NG = 1; __VA_ARGS__; break; } \
    case 2: { constexpr int NG = 2; __VA_ARGS__; break; } \
    case 3: { constexpr int NG = 3; __VA_ARGS__; break; } \
    case 4: { constexpr int NG = 4; __VA_ARGS__; break; } \
    case 5: { constexpr int NG = 5; __VA_ARGS__; break; } \
    case 6: { constexpr int NG = 6; __VA_ARGS__; break; } \
    case 7: { constexpr int NG = 7; __VA_ARGS__; break; } \
    default: { constexpr int NG = 8; __VA_ARGS__; break; } \
  }

// s[g * kTile + t] = q[g] . k[t] for NG heads from q and NT keys: each chunk of a K row is
// loaded (and widened) once for all the heads that share it, and each chunk of q once for all NT
// keys. Each (head, key) sum runs over d in order, whatever NT is.
template <int NG, int NT, typename T>
inline void dots_of(const float* q, const T* const* k, int64_t D, float* s) {
  fVec acc[NT][NG];
  for (int t = 0; t < NT; ++t)
    for (int g = 0; g < NG; ++g) acc[t][g] = fVec(0.f);
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes) {
    fVec kv[NT];
    for (int t = 0; t < NT; ++t) kv[t] = load_f(k[t] + d);
    for (int g = 0; g < NG; ++g) {
      const fVec qv = fVec::loadu(q + g * D + d);
      for (int t = 0; t < NT; ++t) acc[t][g] = at::vec::fmadd(qv, kv[t], acc[t][g]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int g = 0; g < NG; ++g) {
      float sum = at::vec::vec_reduce_all<float>([](fVec& x, fVec& y) { return x + y; },
                                                 acc[t][g]);
      for (int64_t e = d; e < D; ++e) sum += q[g * D + e] * to_f(k[t][e]);
      s[g * kTile + t] = sum;
    }
}

// Scores of the tile's n keys for all G heads, eight heads at a time; up to four heads, two keys
// at a time as well (2 x 4 accumulators, two keys and a query chunk fit AVX2's 16 registers).
template <int NG, typename T>
inline void dots_for(const float* q, const T* const* k, int64_t n, int64_t D, float* s) {
  int64_t j = 0;
  if constexpr (NG <= 4)
    for (; j + 2 <= n; j += 2) dots_of<NG, 2>(q, k + j, D, s + j);
  for (; j < n; ++j) dots_of<NG, 1>(q, k + j, D, s + j);
}

template <typename T>
inline void dots(const float* q, const T* const* k, int64_t n, int64_t G, int64_t D, float* s) {
  for (int64_t g0 = 0; g0 < G; g0 += 8)
    NANOSERVE_HEADS(std::min<int64_t>(8, G - g0),
                    dots_for<NG>(q + g0 * D, k, n, D, s + g0 * kTile))
}

// acc[g] += sum over j < n of w[g][j] * v[j] for NG heads, on the D-chunk at d: the heads'
// accumulators stay in registers across the tile's tokens, so acc is read and written once a
// tile rather than once a token, and each V chunk is loaded once for all the heads. The sum
// runs over j in order, as a token-at-a-time loop would: the result is the same to the bit.
template <int NG, typename T>
inline void weigh_chunk(const T* const* vrows, int64_t n, const float* w, int64_t D, int64_t d,
                        float* acc) {
  fVec a[NG];
  for (int g = 0; g < NG; ++g) a[g] = fVec::loadu(acc + g * D + d);
  for (int64_t j = 0; j < n; ++j) {
    const fVec vv = load_f(vrows[j] + d);
    for (int g = 0; g < NG; ++g) a[g] = at::vec::fmadd(fVec(w[g * kTile + j]), vv, a[g]);
  }
  for (int g = 0; g < NG; ++g) a[g].store(acc + g * D + d);
}

template <typename T>
inline void weigh_values(const T* const* vrows, int64_t n, const float* w, int64_t G, int64_t D,
                         float* acc) {
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes)
    for (int64_t g0 = 0; g0 < G; g0 += 8)
      NANOSERVE_HEADS(std::min<int64_t>(8, G - g0),
                      weigh_chunk<NG>(vrows, n, w + g0 * kTile, D, d, acc + g0 * D))
  for (; d < D; ++d)  // the tail of a head_dim that is not whole registers
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < n; ++j) acc[g * D + d] += w[g * kTile + j] * to_f(vrows[j][d]);
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
  // Where tile t's K and V vectors lie, and a prefetch of each: the tile after the current one
  // is located before the current one is scored, so its cache misses (between layers the
  // weights have pushed the pools out of cache) overlap this tile's arithmetic.
  const T* rows[2][2][kTile];  // [buffer][K or V][token of the tile]
  auto locate = [&](int64_t t, const T** kr, const T** vr) {
    const int64_t n = std::min(kTile, t1 - t);
    int64_t blk = t / bs, off = t % bs;  // token t's place, stepped on without a division
    for (int64_t j = 0; j < n; ++j) {
      const int64_t cell = blocks[blk] * bs + off;
      kr[j] = kpool + (cell * Hkv + h) * D;
      vr[j] = vpool + (cell * Hkv + h) * D;
      for (int64_t b = 0; b < D * (int64_t)sizeof(T); b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(kr[j]) + b);
        __builtin_prefetch(reinterpret_cast<const char*>(vr[j]) + b);
      }
      if (++off == bs) off = 0, ++blk;
    }
  };
  locate(t0, rows[0][0], rows[0][1]);
  for (int64_t t = t0, cur = 0; t < t1; t += kTile, cur ^= 1) {
    const int64_t n = std::min(kTile, t1 - t);
    if (t + kTile < t1) locate(t + kTile, rows[cur ^ 1][0], rows[cur ^ 1][1]);
    const T* const* krows = rows[cur][0];
    const T* const* vrows = rows[cur][1];
    dots(qf, krows, n, G, D, s);
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
    weigh_values(vrows, n, s, G, D, acc);
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
