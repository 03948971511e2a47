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
// A sliding window (window > 0; Mistral's, a layer's own) keeps the last `window` tokens of a
// row: positions max(0, L - window) .. L - 1, so a query at i sees j with i - window < j <= i.
// The splits then start at the window's first token, and no block below it is located,
// prefetched or even checked: a block wholly outside the window may have gone back to the pool,
// and its table entry may name a block another row now owns.
//
// In the engine the pools are cold: between two layers' reads the weights stream through the
// cache. So a task locates and prefetches the K and V vectors kAhead tiles before it scores
// them, and its inner loops keep accumulators in registers (per head and key while scoring, per
// head and D-chunk across a tile while weighing V). A tile's 16 dot products are summed across
// lanes together (a tree of shuffles, sum_lanes) rather than one horizontal sum per key, its
// exponentials take ATen's inline exp_u20 (a polynomial within 20 ulp, by ATen's own comment)
// rather than a call to Sleef's 1-ulp exp, the online rescale rides on the accumulator's load,
// and a row of one split writes its output straight from the task. Day 55's snapshot is the
// version without these: the outputs agree to float32 rounding, no longer to the bit.
#include <algorithm>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace nanoserve {
namespace {

constexpr int64_t kSplit = 512;  // tokens per split: parallel work for few rows, long contexts
constexpr int64_t kTile = 16;    // tokens scored before one online-softmax update
constexpr int64_t kAhead = 2;    // tiles located and prefetched ahead of the one scored

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

// p[g * kTile + t] = the lane-wise products q[g] . k[t] summed over D's whole registers, for NG
// heads and NT keys: each chunk of a K row is loaded (and widened) once for all the heads that
// share it. The lanes are summed later, a tile at a time (sum_lanes).
template <int NG, int NT, typename T>
inline void partials_of(const float* q, const T* const* k, int64_t D, float* p) {
  fVec acc[NT][NG];
  for (int t = 0; t < NT; ++t)
    for (int g = 0; g < NG; ++g) acc[t][g] = fVec(0.f);
  for (int64_t d = 0; d + kLanes <= D; d += kLanes) {
    fVec kv[NT];
    for (int t = 0; t < NT; ++t) kv[t] = load_f(k[t] + d);
    for (int g = 0; g < NG; ++g) {
      const fVec qv = fVec::loadu(q + g * D + d);
      for (int t = 0; t < NT; ++t) acc[t][g] = at::vec::fmadd(qv, kv[t], acc[t][g]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int g = 0; g < NG; ++g) acc[t][g].store(p + (g * kTile + t) * kLanes);
}

// out[t] = the sum of p[t]'s lanes for the kTile registers of one head. With AVX-512 a tree of
// unpacks and shuffles adds the 16 registers pairwise into one register of 16 sums (45
// instructions for the tile, where a horizontal sum per key takes about 8 each); elsewhere one
// horizontal sum per key.
inline void sum_lanes(const float* p, float* out) {
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(kTile == 16 && kLanes == 16, "the tree sums 16 registers of 16 lanes");
  __m512 y[8], z[4], w[2];
  for (int i = 0; i < 8; ++i) {  // per 128-bit chunk: pairs of lanes of keys 2i and 2i+1
    const __m512 a = _mm512_load_ps(p + 2 * i * 16), b = _mm512_load_ps(p + (2 * i + 1) * 16);
    y[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int i = 0; i < 4; ++i)  // per chunk: its 4 lanes summed, for keys 4i .. 4i+3
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 2; ++i)  // chunks 0+1 and 2+3, for keys 8i .. 8i+7
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1))));
#else
  for (int64_t t = 0; t < kTile; ++t)
    out[t] = at::vec::vec_reduce_all<float>([](fVec& x, fVec& y) { return x + y; },
                                            fVec::loadu(p + t * kLanes));
#endif
}

// Scores of the tile's n keys for NG heads into s[g * kTile + t]: lane-wise partials two keys at
// a time up to four heads (2 x 4 accumulators, two keys and a query chunk fit AVX2's 16
// registers), one key at a time beyond; then each head's lanes summed over the tile at once,
// and the scalar tail of a head_dim that is not whole registers added per key.
template <int NG, typename T>
inline void scores_for(const float* q, const T* const* k, int64_t n, int64_t D, float* s) {
  alignas(64) float p[NG * kTile * kLanes];  // (head, key, lane); not a Vectorized array,
  int64_t j = 0;                               // whose constructor would zero it per tile
  if constexpr (NG <= 4)
    for (; j + 2 <= n; j += 2) partials_of<NG, 2>(q, k + j, D, p + j * kLanes);
  for (; j < n; ++j) partials_of<NG, 1>(q, k + j, D, p + j * kLanes);
  for (int g = 0; g < NG; ++g) {
    for (int64_t t = n; t < kTile; ++t) fVec(0.f).store(p + (g * kTile + t) * kLanes);
    sum_lanes(p + g * kTile * kLanes, s + g * kTile);
  }
  const int64_t d0 = D / kLanes * kLanes;
  if (d0 < D)
    for (int g = 0; g < NG; ++g)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t e = d0; e < D; ++e) s[g * kTile + t] += q[g * D + e] * to_f(k[t][e]);
}

template <typename T>
inline void scores(const float* q, const T* const* k, int64_t n, int64_t G, int64_t D,
                   float* s) {
  for (int64_t g0 = 0; g0 < G; g0 += 8)
    NANOSERVE_HEADS(std::min<int64_t>(8, G - g0),
                    scores_for<NG>(q + g0 * D, k, n, D, s + g0 * kTile))
}

// acc[g] = acc[g] * alpha[g] + sum over j < n of w[g][j] * v[j] for NG heads, on the D-chunk
// at d: the online softmax's rescale of the old accumulator is folded into its load, and the
// heads' accumulators stay in registers across the tile's tokens, so acc is read and written
// once a tile rather than once a token, and each V chunk is loaded once for all the heads.
template <int NG, typename T>
inline void weigh_chunk(const T* const* vrows, int64_t n, const float* w, const float* alpha,
                        int64_t D, int64_t d, float* acc) {
  fVec a[NG];
  for (int g = 0; g < NG; ++g) a[g] = fVec::loadu(acc + g * D + d) * fVec(alpha[g]);
  for (int64_t j = 0; j < n; ++j) {
    const fVec vv = load_f(vrows[j] + d);
    for (int g = 0; g < NG; ++g) a[g] = at::vec::fmadd(fVec(w[g * kTile + j]), vv, a[g]);
  }
  for (int g = 0; g < NG; ++g) a[g].store(acc + g * D + d);
}

template <typename T>
inline void weigh_values(const T* const* vrows, int64_t n, const float* w, const float* alpha,
                         int64_t G, int64_t D, float* acc) {
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes)
    for (int64_t g0 = 0; g0 < G; g0 += 8)
      NANOSERVE_HEADS(std::min<int64_t>(8, G - g0),
                      weigh_chunk<NG>(vrows, n, w + g0 * kTile, alpha + g0, D, d, acc + g0 * D))
  for (; d < D; ++d)  // the tail of a head_dim that is not whole registers
    for (int64_t g = 0; g < G; ++g) {
      float a = acc[g * D + d] * alpha[g];
      for (int64_t j = 0; j < n; ++j) a += w[g * kTile + j] * to_f(vrows[j][d]);
      acc[g * D + d] = a;
    }
}

// The larger of each lane pair: vmaxps where the ISA has it (where either is NaN it gives b, so a
// NaN may or may not survive a chain of them), at::vec's NaN-propagating maximum elsewhere.
inline fVec max_of(fVec a, fVec b) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_max_ps(a, b);
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_max_ps(a, b);
#else
  return at::vec::maximum(a, b);
#endif
}

// One task: row b, KV head h, tokens [t0, t1). Leaves m (G), l (G), acc (G, D).
template <typename T>
void attend_split(const T* q, const T* kpool, const T* vpool, const int64_t* blocks,
                  int64_t bs, int64_t Hkv, int64_t G, int64_t D, int64_t h, int64_t t0,
                  int64_t t1, float scale, float* m, float* l, float* acc) {
  alignas(64) float qf[kMaxGD];
  alignas(64) float s[8 * kTile * 8];  // G <= 64 heads per KV head, checked by the caller
  float alpha[64];                     // each head's rescale of its accumulator, per tile
  int64_t e = 0;
  for (const fVec sv(scale); e + kLanes <= G * D; e += kLanes)
    (load_f(q + e) * sv).store(qf + e);
  for (; e < G * D; ++e) qf[e] = to_f(q[e]) * scale;
  for (int64_t g = 0; g < G; ++g) m[g] = -INFINITY, l[g] = 0.f;
  std::fill(acc, acc + G * D, 0.f);
  // Where tile t's K and V vectors lie, and a prefetch of each: the tile kAhead after the
  // current one is located before the current one is scored, so its cache misses (between
  // layers the weights have pushed the pools out of cache) overlap arithmetic.
  const T* rows[kAhead + 1][2][kTile];  // [tile mod kAhead + 1][K or V][token of the tile]
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
  for (int64_t i = 0; i < kAhead && t0 + i * kTile < t1; ++i)
    locate(t0 + i * kTile, rows[i][0], rows[i][1]);
  for (int64_t t = t0, cur = 0; t < t1; t += kTile, cur = cur == kAhead ? 0 : cur + 1) {
    const int64_t n = std::min(kTile, t1 - t), next = t + kAhead * kTile;
    if (next < t1) {
      const int64_t slot = cur == 0 ? kAhead : cur - 1;  // the tile before this one: done
      locate(next, rows[slot][0], rows[slot][1]);
    }
    const T* const* krows = rows[cur][0];
    const T* const* vrows = rows[cur][1];
    scores(qf, krows, n, G, D, s);
    for (int64_t g = 0; g < G; ++g) {  // online softmax: new max, weights in place, rescale
      float* sg = s + g * kTile;
      for (int64_t j = n; j < kTile; ++j) sg[j] = -INFINITY;  // a short last tile weighs 0
      fVec mv(m[g]);  // a NaN score may miss the max; its own exp below carries it into acc
      for (int64_t j = 0; j < kTile; j += kLanes) mv = max_of(mv, fVec::loadu(sg + j));
      const float mx = at::vec::vec_reduce_all<float>(max_of, mv);
      mv = fVec(mx);
      fVec sum(0.f);
      for (int64_t j = 0; j < kTile; j += kLanes) {
        const fVec w = (fVec::loadu(sg + j) - mv).exp_u20();
        w.store(sg + j);
        sum = sum + w;
      }
      alpha[g] = std::exp(m[g] - mx);
      l[g] = l[g] * alpha[g] +
             at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, sum);
      m[g] = mx;
    }
    weigh_values(vrows, n, s, alpha, G, D, acc);
  }
}

}  // namespace

void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_pool,
                            const at::Tensor& v_pool, const at::Tensor& block_table,
                            const at::Tensor& context_lens, int64_t block_size, double scale,
                            int64_t window) {
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
  // Row b reads tokens first[b] .. lens[b] - 1: all of them, or the window's last ones.
  std::vector<int64_t> first(B, 0);
  int64_t splits = 1;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= W * block_size, "paged_decode_attention: row ", b,
                " has context ", lens[b], "; its table addresses ", W * block_size, " tokens");
    if (window > 0) first[b] = std::max<int64_t>(0, lens[b] - window);
    for (int64_t w = first[b] / block_size; w < (lens[b] + block_size - 1) / block_size; ++w)
      TORCH_CHECK(bt[b * W + w] >= 0 && (bt[b * W + w] + 1) * block_size <= cells,
                  "paged_decode_attention: row ", b, " names block ", bt[b * W + w],
                  ", outside the pool");
    splits = std::max(splits, (lens[b] - first[b] + kSplit - 1) / kSplit);
  }
  // Partial results per (row, KV head, split): max and sum per query head, then G x D. A row
  // of one split needs none: its task divides and writes the output itself.
  std::vector<float> part(splits > 1 ? (size_t)B * Hkv * splits * G * (D + 2) : 0);
  const int64_t stride = G * (D + 2);
  NANOSERVE_DISPATCH(dt, "paged_decode_attention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k_pool.data_ptr<scalar_t>();
    const scalar_t* vp = v_pool.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * Hkv * splits, 1, [&](int64_t lo, int64_t hi) {
      alignas(64) float own[kMaxGD + 128];  // m, l, acc of a row that has one split
      for (int64_t task = lo; task < hi; ++task) {
        const int64_t b = task / (Hkv * splits), h = task / splits % Hkv, sp = task % splits;
        const int64_t t0 = first[b] + sp * kSplit, t1 = std::min(lens[b], t0 + kSplit);
        if (t0 >= t1) continue;
        const bool alone = lens[b] - first[b] <= kSplit;
        float* base = alone ? own : part.data() + task * stride;
        attend_split(qp + (b * Hq + h * G) * D, kp, vp, bt + b * W, block_size, Hkv, G, D, h,
                     t0, t1, (float)scale, base, base + G, base + 2 * G);
        if (alone)
          for (int64_t g = 0; g < G; ++g) {
            const float* a = base + 2 * G + g * D;
            scalar_t* dst = op + (b * Hq + h * G + g) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] = from_f<scalar_t>(a[d] / base[G + g]);
          }
      }
    });
    if (splits == 1) return;
    at::parallel_for(0, B * Hkv, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> o(D);
      for (int64_t bh = lo; bh < hi; ++bh) {
        const int64_t b = bh / Hkv, h = bh % Hkv;
        const int64_t used = (lens[b] - first[b] + kSplit - 1) / kSplit;
        if (used == 1) continue;  // written by its task
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
