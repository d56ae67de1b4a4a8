// What the row headers (window_verify_row.h, compact_topk_row.h) share: their functions compile for the host (the
// C++ CPU ops) and, under nvcc, for the device too (the CUDA kernels), so one row code serves both.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SV_HD __host__ __device__ __forceinline__
#define SV_UNROLL _Pragma("unroll")
#else
#define SV_HD inline
#define SV_UNROLL
#endif

// A float's bits (for keys that order floats as unsigned integers).
SV_HD uint32_t sv_float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}
