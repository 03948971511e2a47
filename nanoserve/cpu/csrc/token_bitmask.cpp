// A grammar's bitmask applied to the logits of its rows, in place (Day 68).
//
// Structured outputs give each constrained row a bitmask over the vocabulary: bit j of word w
// allows token 32 w + j. The PyTorch path unpacks the words into an (n, V) boolean (a shift, an
// and, a cast: three passes and two temporaries of n x V) and then masks a gathered copy of the
// rows. Here each row is one pass over its words: a word of all ones (every token allowed) is
// skipped, a word of zeros writes 32 -infs, anything else tests its bits. Columns past the last
// word (a vocabulary wider than the mask) are set to -inf too, as no grammar allows them.
//
// logits (B, V) float32, rows (n,) int64 row indices into logits, words (n, W) int32.
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>

#include "ops.h"

namespace nanoserve {

void apply_token_bitmask(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& words) {
  TORCH_CHECK(logits.device().is_cpu() && rows.device().is_cpu() && words.device().is_cpu(),
              "apply_token_bitmask: a CPU op");
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() &&
                  logits.scalar_type() == at::kFloat,
              "apply_token_bitmask: logits must be a contiguous (B, V) float32 tensor");
  TORCH_CHECK(words.dim() == 2 && words.is_contiguous() && words.scalar_type() == at::kInt,
              "apply_token_bitmask: words must be a contiguous (n, W) int32 tensor");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous() &&
                  rows.size(0) == words.size(0),
              "apply_token_bitmask: rows must be (n,) int64, one per row of words");
  const int64_t B = logits.size(0), V = logits.size(1), n = words.size(0), W = words.size(1);
  const int64_t* rp = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(rp[i] >= 0 && rp[i] < B, "apply_token_bitmask: row ", rp[i], " is outside 0..",
                B - 1);
  }
  const int32_t* wp = words.data_ptr<int32_t>();
  float* lp = logits.data_ptr<float>();
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t covered = std::min<int64_t>(V, 32 * W);
  constexpr int64_t kChunk = 512;  // words per task: 16k logits, big enough to pay for a fork
  const int64_t chunks = (W + kChunk - 1) / kChunk;
  at::parallel_for(0, n * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / chunks, c = t % chunks;
      float* row = lp + rp[i] * V;
      const int32_t* mask = wp + i * W;
      const int64_t w_end = std::min<int64_t>(W, (c + 1) * kChunk);
      for (int64_t w = c * kChunk; w < w_end; ++w) {
        const uint32_t bits = static_cast<uint32_t>(mask[w]);
        const int64_t base = 32 * w;
        const int64_t width = std::min<int64_t>(32, covered - base);
        if (width <= 0 || bits == 0xFFFFFFFFu) continue;
        if (bits == 0) {
          std::fill(row + base, row + base + width, ninf);
          continue;
        }
        for (int64_t j = 0; j < width; ++j) {
          if (!((bits >> j) & 1u)) row[base + j] = ninf;
        }
      }
      if (c == chunks - 1 && covered < V) std::fill(row + covered, row + V, ninf);
    }
  });
}

}  // namespace nanoserve
