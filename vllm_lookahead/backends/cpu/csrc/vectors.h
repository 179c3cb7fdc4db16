// The vector width and the float32 / bfloat16 vector loads both sources of the compiled library use (GCC/Clang
// vector extensions: one source builds for AVX-512, AVX2 or anything else; kernel.py picks the flags).
#pragma once
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
constexpr int VW = 16;
#elif defined(__AVX2__) || defined(__AVX__)
constexpr int VW = 8;
#else
constexpr int VW = 4;
#endif

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));
typedef uint16_t vh __attribute__((vector_size(VW * 2)));

static inline vf splat(float s) {
  vf v = {};
  return v + s;
}
static inline vf loadv(const float* p) {
  vf v;
  memcpy(&v, p, sizeof(v));
  return v;
}
static inline vf loadv(const uint16_t* p) {
  vh h;
  memcpy(&h, p, sizeof(h));
  vu u = __builtin_convertvector(h, vu) << 16;
  return (vf)u;
}
static inline void storev(float* p, vf v) { memcpy(p, &v, sizeof(v)); }
static inline float load1(const float* p) { return *p; }
static inline float load1(const uint16_t* p) {
  uint32_t b = (uint32_t)(*p) << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
