// What the row headers (window_verify_row.h, compact_topk_row.h) share: their functions compile for the host (the
// C++ CPU ops) and, under nvcc, for the device too (the CUDA kernels), so one row code serves both.
#pragma once

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SV_HD __host__ __device__ __forceinline__
#else
#define SV_HD inline
#endif
