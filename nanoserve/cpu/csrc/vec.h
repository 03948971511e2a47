// What every op here shares: ATen's at::vec at the widest width this compiler may emit, and the
// two conversions between a storage type (float or BFloat16) and float registers.
//
// at::vec picks its implementation from CPU_CAPABILITY_* macros that PyTorch's own build sets per
// kernel file. An extension has to set them itself, before the first ATen include, from what the
// compiler was told the CPU can do (-march=native at build time; the build is cached per CPU).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace nanoserve {

using fVec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = fVec::size();  // floats in one register: 16 on AVX-512, 8 on AVX2

// Load kLanes elements of T starting at p as floats.
template <typename T>
inline fVec load_f(const T* p);

template <>
inline fVec load_f<float>(const float* p) { return fVec::loadu(p); }

template <>
inline fVec load_f<c10::BFloat16>(const c10::BFloat16* p) {
  fVec out;  // a bf16 is the top half of a float: widening is exact
  at::vec::load_to_float<c10::BFloat16>(p, out);
  return out;
}

// Store kLanes floats to T at p, rounding to nearest even for bf16 (as PyTorch's cast does).
template <typename T>
inline void store_f(T* p, const fVec& v);

template <>
inline void store_f<float>(float* p, const fVec& v) { v.store(p); }

template <>
inline void store_f<c10::BFloat16>(c10::BFloat16* p, const fVec& v) {
  at::vec::convert_from_float<c10::BFloat16>(v, v).store(p, kLanes);  // round to nearest even
}

// Round a float register to T's precision and widen it again: the reference rounds to the
// storage dtype after each PyTorch op, and the fused ops round where it does.
template <typename T>
inline fVec round_to(const fVec& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    auto [lo, hi] = at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v, v));
    (void)hi;
    return lo;
  }
}

template <typename T>
inline float round_to(float x) { return static_cast<float>(static_cast<T>(x)); }

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }

template <typename T>
inline T from_f(float x) { return static_cast<T>(x); }

// Run fn<T> for the tensor's dtype; the ops take float32 and bfloat16 only.
#define NANOSERVE_DISPATCH(dtype, name, ...)                                        \
  [&] {                                                                             \
    if ((dtype) == at::kFloat) {                                                    \
      using scalar_t = float;                                                       \
      return __VA_ARGS__();                                                         \
    } else if ((dtype) == at::kBFloat16) {                                          \
      using scalar_t = c10::BFloat16;                                               \
      return __VA_ARGS__();                                                         \
    }                                                                               \
    TORCH_CHECK(false, name, " takes float32 or bfloat16, got ", (dtype));          \
  }()

}  // namespace nanoserve
