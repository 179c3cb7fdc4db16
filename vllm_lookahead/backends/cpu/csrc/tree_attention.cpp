// Tree attention over vLLM's paged CPU KV cache, for the rows of lookahead trees.
//
// Every tree node attends its request's whole cached prefix plus its own ancestors and itself, read in place
// from the paged cache through the block table (vLLM has written this step's K/V before attention runs).
// GCC/Clang vector extensions, so one source builds for AVX-512, AVX2 or anything else (NEON, SSE);
// tree_kernel.py picks the flags. Plain C ABI (ctypes), no torch headers; OpenMP from the process's runtime.
//
// Work item = (tree request, KV head, chunk of tree nodes), the rows being chunk nodes x query heads of that KV
// head, so each key block is read once per item. Per key block: S = Q K (keys read in the cache's layout, below),
// the ancestor mask (uint64 bitsets) on the tree's own keys (positions >= P), online softmax in base 2 (scale and
// log2(e) folded into Q), O = O * alpha + P V. Accumulation in float32; bf16 output rounded to nearest even.
// Keys past seq_len in the last block are stale memory: S is masked there and P V stops at the last key.
//
// Layouts (layouts.py describes them; per block and KV head, token t, dimension d): LAYOUT_VEC ("vec", "vec16"):
// keys [D, bs], values [bs, D]. LAYOUT_AMX (bf16 only): keys in groups of 16 tokens, each [D / 2, 16, 2] (a 32-bit
// word holds dimensions d, d + 1 of one token); values in groups of 16 dimensions, each [bs / 2, 16, 2] (a word
// holds tokens t, t + 1 of one dimension). One load of VW words then gives two vectors: the low halves and the high.
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "vectors.h"

namespace {

#if defined(__AVX512F__)
constexpr int QK_R = 6, QK_KT = 2, PV_R = 6, PV_NVC = 4;
#elif defined(__AVX2__) || defined(__AVX__)
constexpr int QK_R = 4, QK_KT = 2, PV_R = 3, PV_NVC = 4;
#else
constexpr int QK_R = 4, QK_KT = 2, PV_R = 2, PV_NVC = 4;
#endif

enum { LAYOUT_VEC = 0, LAYOUT_AMX = 1 };
constexpr int AMX_G = 16;  // an AMX tile row: 16 words (keys grouped by 16 tokens, values by 16 dimensions)
// how many dimensions one key load gives (amx: a word holds two), and how many tokens one value load gives
template <int Lay>
constexpr int KSTEP = Lay == LAYOUT_AMX ? 2 : 1;
template <int Lay>
constexpr int VSTEP = Lay == LAYOUT_AMX ? 2 : 1;

// VW words of bf16 pairs: the low halves' floats and the high halves'
static inline void load_pairs(const uint16_t* p, vf& lo, vf& hi) {
  vu u;
  memcpy(&u, p, sizeof(u));
  lo = (vf)(u << 16);
  hi = (vf)(u & 0xFFFF0000u);
}
static inline void load_pairs(const float*, vf&, vf&) { __builtin_unreachable(); }  // amx is bf16 only
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < VW; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
static inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < VW; ++i) s += v[i];
  return s;
}

// 2^x for x <= 0; exactly 0 below -126 (masked keys give -inf)
static inline vf exp2v(vf x) {
  const vi dead = x < splat(-126.f);
  x = vmax(x, splat(-126.f));
  const vi k = __builtin_convertvector(x, vi);  // trunc toward 0 = ceil for x <= 0
  const vf f = x - __builtin_convertvector(k, vf) + splat(0.5f);  // (-0.5, 0.5]
  const float l = 0.6931471805599453f;
  vf p = splat(l * l * l * l * l * l * l / 5040.f);
  p = p * f + l * l * l * l * l * l / 720.f;
  p = p * f + l * l * l * l * l / 120.f;
  p = p * f + l * l * l * l / 24.f;
  p = p * f + l * l * l / 6.f;
  p = p * f + l * l / 2.f;
  p = p * f + l;
  p = p * f + 1.f;
  const vu e = (vu)((k + 127) << 23);
  vf r = p * 0.7071067811865476f * (vf)e;
  return (vf)((vu)r & ~(vu)dead);
}

// Keys of tokens t .. t + VW - 1 (t a multiple of VW) at dimensions d .. d + KSTEP - 1 of one block and head.
template <int Lay, int D, typename KT>
static inline void load_keys(const KT* K, int bs, int t, int d, vf* out) {
  if constexpr (Lay == LAYOUT_AMX)
    load_pairs(K + (int64_t)(t / AMX_G) * AMX_G * D + d * AMX_G + (t % AMX_G) * 2, out[0], out[1]);
  else
    out[0] = loadv(K + (int64_t)d * bs + t);
}

// Values of dimensions c * VW .. c * VW + VW - 1 for tokens t .. t + VSTEP - 1 (amx: t even) of one block and head.
template <int Lay, int D, typename VT>
static inline void load_values(const VT* V, int bs, int t, int c, vf* out) {
  if constexpr (Lay == LAYOUT_AMX) {
    const int d0 = c * VW;
    load_pairs(V + (int64_t)(d0 / AMX_G) * AMX_G * bs + (t / 2) * 2 * AMX_G + (d0 % AMX_G) * 2, out[0], out[1]);
  } else {
    out[0] = loadv(V + (int64_t)t * D + c * VW);
  }
}

template <int R, int D, typename KT, int Lay>
static inline void qk_tile(const float* Q, const KT* K, int bs, float* S, int nt) {
  int t = 0;
  for (; t + QK_KT * VW <= nt; t += QK_KT * VW) {
    vf a[R][QK_KT];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < QK_KT; ++j) a[r][j] = splat(0.f);
    for (int d = 0; d < D; d += KSTEP<Lay>) {
      vf kv[QK_KT][KSTEP<Lay>];
#pragma GCC unroll 4
      for (int j = 0; j < QK_KT; ++j) load_keys<Lay, D>(K, bs, t + j * VW, d, kv[j]);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int e = 0; e < KSTEP<Lay>; ++e) {
          const float qv = Q[r * D + d + e];
#pragma GCC unroll 4
          for (int j = 0; j < QK_KT; ++j) a[r][j] += kv[j][e] * qv;
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < QK_KT; ++j) storev(S + r * bs + t + j * VW, a[r][j]);
  }
  for (; t < nt; t += VW) {
    vf a[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[r] = splat(0.f);
    for (int d = 0; d < D; d += KSTEP<Lay>) {
      vf kv[KSTEP<Lay>];
      load_keys<Lay, D>(K, bs, t, d, kv);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int e = 0; e < KSTEP<Lay>; ++e) a[r] += kv[e] * Q[r * D + d + e];
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) storev(S + r * bs + t, a[r]);
  }
}

// O[R, columns c0 .. c0 + C) = O * alpha + P[R, tl] V[tl, those columns] (a column: VW dimensions)
template <int R, int D, typename VT, int Lay, int C>
static inline void pv_cols(const float* Pm, int bs, const VT* V, int tl, float* O, const float* alpha, int c0) {
  constexpr int VS = VSTEP<Lay>;
  vf acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) acc[r][j] = loadv(O + r * D + (c0 + j) * VW) * alpha[r];
  for (int t = 0; t < tl; t += VS) {
    vf v[C][VS];
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) load_values<Lay, D>(V, bs, t, c0 + j, v[j]);
    if (VS == 2 && t + 1 == tl)  // the pair's other token is past seq_len: stale memory, maybe not even finite
#pragma GCC unroll 8
      for (int j = 0; j < C; ++j) v[j][VS - 1] = splat(0.f);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int e = 0; e < VS; ++e) {
        const float p = (t + e < tl) ? Pm[r * bs + t + e] : 0.f;
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j) acc[r][j] += v[j][e] * p;
      }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) storev(O + r * D + (c0 + j) * VW, acc[r][j]);
}

// O[R, D] = O * alpha + P[R, tl] V[tl, D], D processed PV_NVC vectors at a time
template <int R, int D, typename VT, int Lay>
static inline void pv_tile(const float* Pm, int bs, const VT* V, int tl, float* O, const float* alpha) {
  constexpr int NV = D / VW, FULL = NV / PV_NVC * PV_NVC;
  for (int c0 = 0; c0 < FULL; c0 += PV_NVC) pv_cols<R, D, VT, Lay, PV_NVC>(Pm, bs, V, tl, O, alpha, c0);
  for (int c0 = FULL; c0 < NV; ++c0) pv_cols<R, D, VT, Lay, 1>(Pm, bs, V, tl, O, alpha, c0);
}

// The rows left over after whole tiles go through one tile of their own height (not one row at a time).
template <int D, typename KT, int Lay, int R = QK_R - 1>
static inline void qk_rest(const float* Q, const KT* K, int bs, float* S, int rest, int nt) {
  if constexpr (R > 0) {
    if (rest == R) return qk_tile<R, D, KT, Lay>(Q, K, bs, S, nt);
    qk_rest<D, KT, Lay, R - 1>(Q, K, bs, S, rest, nt);
  }
}

template <int D, typename VT, int Lay, int R = PV_R - 1>
static inline void pv_rest(const float* Pm, int bs, const VT* V, int tl, float* O, const float* alpha, int rest) {
  if constexpr (R > 0) {
    if (rest == R) return pv_tile<R, D, VT, Lay>(Pm, bs, V, tl, O, alpha);
    pv_rest<D, VT, Lay, R - 1>(Pm, bs, V, tl, O, alpha, rest);
  }
}

template <int D, typename KT, int Lay>
static void qk_rows(const float* Q, const KT* K, int bs, float* S, int rows, int nt) {
  int r = 0;
  for (; r + QK_R <= rows; r += QK_R) qk_tile<QK_R, D, KT, Lay>(Q + r * D, K, bs, S + r * bs, nt);
  qk_rest<D, KT, Lay>(Q + r * D, K, bs, S + r * bs, rows - r, nt);
}

template <int D, typename VT, int Lay>
static void pv_rows(const float* Pm, int bs, const VT* V, int tl, float* O, const float* alpha, int rows) {
  int r = 0;
  for (; r + PV_R <= rows; r += PV_R) pv_tile<PV_R, D, VT, Lay>(Pm + r * bs, bs, V, tl, O + r * D, alpha + r);
  pv_rest<D, VT, Lay>(Pm + r * bs, bs, V, tl, O + r * D, alpha + r, rows - r);
}

// bf16 keys and values widened once per block and item, not once per tile of rows that reads them: worth it from
// three tiles of rows on (measured: with two tiles the float32 copy's round trip through the cache costs more).
constexpr int WIDEN_MIN_ROWS = 2 * QK_R + 1;
// The widened copies are in the vec layout whatever the cache's: keys [D, bs], values [tl, D].
template <int Lay, int D>
static inline void widen_keys(const uint16_t* K, float* KF, int bs) {
  if constexpr (Lay == LAYOUT_VEC) {
    for (int i = 0; i < bs * D; i += VW) storev(KF + i, loadv(K + i));
  } else {
    for (int d = 0; d < D; d += KSTEP<Lay>)
      for (int t = 0; t < bs; t += VW) {
        vf kv[KSTEP<Lay>];
        load_keys<Lay, D>(K, bs, t, d, kv);
        for (int e = 0; e < KSTEP<Lay>; ++e) storev(KF + (int64_t)(d + e) * bs + t, kv[e]);
      }
  }
}
template <int Lay, int D>
static inline void widen_values(const uint16_t* V, float* VF, int bs, int tl) {
  if constexpr (Lay == LAYOUT_VEC) {
    for (int i = 0; i < tl * D; i += VW) storev(VF + i, loadv(V + i));
  } else {
    for (int t = 0; t < tl; t += VSTEP<Lay>)
      for (int c = 0; c < D / VW; ++c) {
        vf v[VSTEP<Lay>];
        load_values<Lay, D>(V, bs, t, c, v);
        for (int e = 0; e < VSTEP<Lay> && t + e < tl; ++e) storev(VF + (int64_t)(t + e) * D + c * VW, v[e]);
      }
  }
}

static inline uint16_t f2bf(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}

struct Args {
  const void* q;
  int64_t q_s0, q_s1;
  const void* kv;
  int64_t kv_s0, kv_s1;
  void* out;
  int64_t o_s0, o_s1;
  const int32_t* items;
  int32_t num_items;
  const int32_t* block_table;
  int64_t bt_s0;
  const uint64_t* masks;
  int32_t mask_words;
  float scale;
  int32_t bs, D, G;
  int32_t bf16;
  int32_t max_rows;
  int32_t layout;
};

template <int D, typename T, int Lay>
static void run_item(const Args& a, const int32_t* it, float* buf) {
  const int q_start = it[0], n = it[1], P = it[2], lo = it[3], hi = it[4], row0 = it[5], h = it[6], req = it[7];
  const int G = a.G, bs = a.bs, W = a.mask_words;
  const int nn = hi - lo, rows = nn * G;
  const int seq_len = P + n;
  float* Q = buf;
  float* O = Q + a.max_rows * D;
  float* S = O + a.max_rows * D;
  float* M = S + a.max_rows * bs;
  float* L = M + a.max_rows;
  float* AL = L + a.max_rows;
  float* KF = AL + a.max_rows;  // bf16 only: this block's keys [D, bs] and values [tl, D] in float32 (vec layout)
  float* VF = KF + bs * D;
  const T* q = (const T*)a.q;
  const float qscale = a.scale * 1.4426950408889634f;
  for (int u = 0; u < nn; ++u)
    for (int g = 0; g < G; ++g) {
      const T* src = q + (int64_t)(q_start + lo + u) * a.q_s0 + (int64_t)(h * G + g) * a.q_s1;
      float* dst = Q + (u * G + g) * D;
      for (int d = 0; d < D; ++d) dst[d] = load1(src + d) * qscale;
    }
  for (int i = 0; i < rows; ++i) {
    M[i] = -INFINITY;
    L[i] = 0.f;
  }
  memset(O, 0, sizeof(float) * rows * D);
  const int nblk = (seq_len + bs - 1) / bs;
  const int32_t* bt = a.block_table + (int64_t)req * a.bt_s0;
  const T* kvb = (const T*)a.kv;
  for (int bi = 0; bi < nblk; ++bi) {
    const T* K = kvb + (int64_t)bt[bi] * a.kv_s0 + (int64_t)h * a.kv_s1;  // this block's keys, in layout Lay
    const T* V = K + (int64_t)bs * D;
    const int t0 = bi * bs;
    const int tl = (seq_len - t0) < bs ? (seq_len - t0) : bs;
    const int nt = (tl + VW - 1) / VW * VW;
    const bool widened = sizeof(T) == 2 && rows >= WIDEN_MIN_ROWS;
    if (widened) {
      widen_keys<Lay, D>((const uint16_t*)K, KF, bs);
      widen_values<Lay, D>((const uint16_t*)V, VF, bs, tl);
      qk_rows<D, float, LAYOUT_VEC>(Q, KF, bs, S, rows, nt);
    } else {
      qk_rows<D, T, Lay>(Q, K, bs, S, rows, nt);
    }
    if (t0 + nt > P) {
      const int tstart = P - t0 > 0 ? P - t0 : 0;
      for (int u = 0; u < nn; ++u) {
        const uint64_t* mrow = a.masks + (int64_t)(row0 + lo + u) * W;
        for (int t = tstart; t < nt; ++t) {
          const int v = t0 + t - P;
          if (t >= tl || !((mrow[v >> 6] >> (v & 63)) & 1))
            for (int g = 0; g < G; ++g) S[(u * G + g) * bs + t] = -INFINITY;
        }
      }
    }
    for (int i = 0; i < rows; ++i) {
      float* s = S + i * bs;
      vf mx = splat(M[i]);
      for (int t = 0; t < nt; t += VW) mx = vmax(mx, loadv(s + t));
      const float mnew = hmax(mx);
      vf sum = splat(0.f);
      for (int t = 0; t < nt; t += VW) {
        const vf p = exp2v(loadv(s + t) - mnew);
        storev(s + t, p);
        sum += p;
      }
      const float alpha = (M[i] == -INFINITY) ? 0.f : exp2f(M[i] - mnew);
      L[i] = L[i] * alpha + hsum(sum);
      M[i] = mnew;
      AL[i] = alpha;
    }
    if (widened)
      pv_rows<D, float, LAYOUT_VEC>(S, bs, VF, tl, O, AL, rows);
    else
      pv_rows<D, T, Lay>(S, bs, V, tl, O, AL, rows);
  }
  T* out = (T*)a.out;
  for (int u = 0; u < nn; ++u)
    for (int g = 0; g < G; ++g) {
      const int i = u * G + g;
      const float inv = 1.f / L[i];
      T* dst = out + (int64_t)(q_start + lo + u) * a.o_s0 + (int64_t)(h * G + g) * a.o_s1;
      const float* src = O + i * D;
      if constexpr (sizeof(T) == 4) {
        for (int d = 0; d < D; ++d) ((float*)dst)[d] = src[d] * inv;
      } else {
        for (int d = 0; d < D; ++d) ((uint16_t*)dst)[d] = f2bf(src[d] * inv);
      }
    }
}

template <int D, typename T, int Lay>
static void run(const Args& a, int parallel) {
  const int64_t per_thread = (int64_t)a.max_rows * (2 * D + a.bs + 3) + (sizeof(T) == 2 ? 2 * a.bs * D : 0) + 64;
  const size_t bytes = ((per_thread * 4 + 63) / 64) * 64;
  if (!parallel) {
    float* buf = (float*)aligned_alloc(64, bytes);
    for (int i = 0; i < a.num_items; ++i) run_item<D, T, Lay>(a, a.items + (int64_t)i * 8, buf);
    free(buf);
    return;
  }
#pragma omp parallel
  {
    float* buf = (float*)aligned_alloc(64, bytes);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < a.num_items; ++i) run_item<D, T, Lay>(a, a.items + (int64_t)i * 8, buf);
    free(buf);
  }
}

}  // namespace

extern "C" int tree_attn_layer(const int64_t* s, const void* q, const void* kv, void* out) {
  // s: the int64 arguments in tree_kernel.ARGS order; the float scale travels as its bit pattern.
  float scale;
  const uint32_t sb = (uint32_t)s[6];
  memcpy(&scale, &sb, 4);
  Args a{q, s[14], s[15], kv, s[16], s[17], out, s[18], s[19], (const int32_t*)s[0], (int32_t)s[1],
         (const int32_t*)s[2], s[3], (const uint64_t*)s[4], (int32_t)s[5], scale, (int32_t)s[7], (int32_t)s[8],
         (int32_t)s[9], (int32_t)s[10], (int32_t)s[11], (int32_t)s[13]};
  const int parallel = (int)s[12];
  if (a.bs % VW) return -1;
  if (a.layout != LAYOUT_VEC && a.layout != LAYOUT_AMX) return -3;
  // amx: bf16, whole 16-token key groups and 16-dimension value groups (vLLM's own amx needs bs % 32, D % 32)
  if (a.layout == LAYOUT_AMX && (!a.bf16 || a.bs % AMX_G || a.D % AMX_G)) return -4;
#define DISPATCH(DD)                                \
  case DD:                                          \
    if (a.layout == LAYOUT_AMX)                     \
      run<DD, uint16_t, LAYOUT_AMX>(a, parallel);   \
    else if (a.bf16)                                \
      run<DD, uint16_t, LAYOUT_VEC>(a, parallel);   \
    else                                            \
      run<DD, float, LAYOUT_VEC>(a, parallel);      \
    return 0;
  switch (a.D) {
    DISPATCH(32)
    DISPATCH(64)
    DISPATCH(80)
    DISPATCH(96)
    DISPATCH(112)
    DISPATCH(128)
    DISPATCH(160)
    DISPATCH(192)
    DISPATCH(224)
    DISPATCH(256)
    default:
      return -2;
  }
}

extern "C" int tree_attn_vector_width() { return VW; }

// Accepted tree nodes' K/V moved to the slots of their chain positions, in every layer's cache, in one call
// (relocation.py): per layer, all sources are read before any destination is written (moves may overlap).
// Where token t's dimension d lives in a block and head's keys / values (p: elements per 32-bit word).
static inline int64_t key_at(int layout, int t, int d, int bs, int D, int p) {
  if (layout == LAYOUT_AMX) return (int64_t)(t / AMX_G) * AMX_G * D + (d / p) * AMX_G * p + (t % AMX_G) * p + d % p;
  return (int64_t)d * bs + t;
}
static inline int64_t value_at(int layout, int t, int d, int bs, int D, int p) {
  if (layout == LAYOUT_AMX) return (int64_t)(d / AMX_G) * AMX_G * bs + (t / p) * AMX_G * p + (d % AMX_G) * p + t % p;
  return (int64_t)t * D + d;
}

template <typename T>
static void move_layer(T* base, const int64_t* src, const int64_t* dst, int m, int H, int bs, int D, int64_t s0,
                       int64_t s1, int layout, T* tmp) {
  const int p = 4 / (int)sizeof(T);
  for (int i = 0; i < m; ++i)
    for (int h = 0; h < H; ++h) {
      const T* c = base + (src[i] / bs) * s0 + h * s1;
      const T* v = c + (int64_t)bs * D;
      const int off = (int)(src[i] % bs);
      T* t = tmp + ((int64_t)i * H + h) * 2 * D;
      for (int d = 0; d < D; ++d) t[d] = c[key_at(layout, off, d, bs, D, p)];
      for (int d = 0; d < D; ++d) t[D + d] = v[value_at(layout, off, d, bs, D, p)];
    }
  for (int i = 0; i < m; ++i)
    for (int h = 0; h < H; ++h) {
      T* c = base + (dst[i] / bs) * s0 + h * s1;
      T* v = c + (int64_t)bs * D;
      const int off = (int)(dst[i] % bs);
      const T* t = tmp + ((int64_t)i * H + h) * 2 * D;
      for (int d = 0; d < D; ++d) c[key_at(layout, off, d, bs, D, p)] = t[d];
      for (int d = 0; d < D; ++d) v[value_at(layout, off, d, bs, D, p)] = t[D + d];
    }
}

extern "C" int kv_move_slots(const int64_t* s, const int64_t* layers, const int64_t* src, const int64_t* dst) {
  // s: num_layers, num_moves, num_kv_heads, block_size, head_size, element bytes, block stride, head stride
  // (strides in elements), layout (LAYOUT_*); layers: each layer's cache base address; src, dst: global slots
  // (block * bs + offset).
  const int L = (int)s[0], m = (int)s[1], H = (int)s[2], bs = (int)s[3], D = (int)s[4], eb = (int)s[5];
  const int layout = (int)s[8];
  if (m <= 0) return 0;
  if (eb != 2 && eb != 4) return -1;
  if (layout != LAYOUT_VEC && layout != LAYOUT_AMX) return -3;
  if (layout == LAYOUT_AMX && (bs % AMX_G || D % AMX_G)) return -4;
  void* tmp = malloc((size_t)m * H * 2 * D * eb);
  if (!tmp) return -3;
  for (int l = 0; l < L; ++l) {
    if (eb == 4)
      move_layer<uint32_t>((uint32_t*)layers[l], src, dst, m, H, bs, D, s[6], s[7], layout, (uint32_t*)tmp);
    else
      move_layer<uint16_t>((uint16_t*)layers[l], src, dst, m, H, bs, D, s[6], s[7], layout, (uint16_t*)tmp);
  }
  free(tmp);
  return 0;
}
