// The k largest entries of each row of a float32 or bfloat16 matrix (a step's logits rows), largest first: the
// target's argmax (k = 1) and its top tokens, as verification and token recycling read them (logit_rows.py).
//
// Order: the larger value first, NaN above every number (vLLM's greedy argmax: torch's and numpy's rule), and of
// equal values the lower index first, so k = 1 is the first maximal index. One pass over a row: each vector of
// entries is compared with the k-th best so far and looked at one by one only where an entry beats it, which after
// the first few hundred entries of a vocabulary almost none does. torch's topk sorts index-value pairs and takes its
// argmax over bfloat16 converted; this reads each row once, in its own dtype.
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "vectors.h"

namespace {

constexpr int MAX_K = 64;
constexpr int UNROLL = 4;  // vectors compared per branch

// a before b: NaN above every number; equal values keep their arrival (index) order.
static inline bool above(float a, float b) {
  if (a != a) return b == b;
  return a > b;
}

struct Best {
  int k, n = 0;
  float v[MAX_K];
  int64_t at[MAX_K];
  explicit Best(int k_) : k(k_) {}
  void offer(float x, int64_t i) {
    if (n == k && !above(x, v[k - 1])) return;
    int pos = n < k ? n++ : k - 1;
    while (pos > 0 && above(x, v[pos - 1])) {
      v[pos] = v[pos - 1];
      at[pos] = at[pos - 1];
      --pos;
    }
    v[pos] = x;
    at[pos] = i;
  }
};

template <typename T>
static void row_top(const T* p, int64_t n, int k, int64_t* out) {
  Best best(k);
  int64_t i = 0;
  for (; i < n && best.n < k; ++i) best.offer(load1(p + i), i);
  constexpr int64_t STEP = VW * UNROLL;
  for (; i + STEP <= n; i += STEP) {
    const float kth = best.v[k - 1];
    vf thr = splat(kth);
    // every entry <= the k-th best (false for NaN): nothing here can enter
    vi le = loadv(p + i) <= thr;
    for (int u = 1; u < UNROLL; ++u) le &= loadv(p + i + u * VW) <= thr;
    int32_t all = -1;
    for (int j = 0; j < VW; ++j) all &= le[j];
    if (all) continue;
    // only the entries above the k-th best (as it rises) are offered
    for (int64_t at = i; at < i + STEP; at += VW) {
      thr = splat(best.v[k - 1]);
      const vi in = loadv(p + at) <= thr;
      for (int j = 0; j < VW; ++j)
        if (!in[j]) best.offer(load1(p + at + j), at + j);
    }
  }
  for (; i < n; ++i) best.offer(load1(p + i), i);
  for (int j = 0; j < k; ++j) out[j] = best.at[j];
}

}  // namespace

// s: rows, cols, row stride (elements), bf16 (0: float32), k; index: the rows to read (rows of them), or null for
// rows 0 .. rows - 1; out: rows x k int64, each row's indices best first. Returns 0, or 1 where k is outside
// 1 .. min(cols, rows_top_k_max()).
extern "C" int rows_top_k(const int64_t* s, const void* data, const int64_t* index, int64_t* out) {
  const int64_t rows = s[0], cols = s[1], stride = s[2], bf16 = s[3], k = s[4];
  if (k < 1 || k > MAX_K || k > cols) return 1;
  // a thread per row where the rows are many (one 49k-token row takes a few microseconds, a fork about as much)
#pragma omp parallel for schedule(static) if (rows >= 8)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = (index ? index[r] : r) * stride;
    if (bf16)
      row_top((const uint16_t*)data + at, cols, (int)k, out + r * k);
    else
      row_top((const float*)data + at, cols, (int)k, out + r * k);
  }
  return 0;
}

extern "C" int rows_top_k_max() { return MAX_K; }
