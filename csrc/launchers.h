// The launchers' C interface, shared by the .cu kernels (which see no torch header) and the .cpp side.
#pragma once

#include <stdint.h>

// Dtype codes shared with the launchers (the .cu files cannot see at::ScalarType).
enum SpecvocabDtype : int { SV_F32 = 0, SV_F16 = 1, SV_BF16 = 2 };

// How indexed_logits / packed_logits are tiled (indexed_logits_kernel.cu explains the kernel). Chosen on the host
// from shapes and the SM count only (indexed_logits.cpp, plan_logits), so a CUDA graph replays the same launch.
// wd: warps splitting d, a function of d and the dtype alone: it fixes the summation order;
// wc = 8 / wd: warps splitting a CTA's columns; mt: 16-column tiles per warp (1, 2; 1 for fp32);
// ntmax: 8-row tiles per piece (2, 4; 2 for fp32), P = 8 * ntmax rows per piece and per row tile;
// vec: 16-byte loads (d * elem_size % 16 == 0 and 16-byte aligned bases), else element loads;
// nsteps: k-steps of d (32 elements for bf16/fp16, 16 for fp32);
// zs: CTAs that share a row tile's pieces (CTA z takes pieces z, z + zs, ...): short pieces (a request's few rows) at
// small d and bs >= 8 would otherwise leave most SMs idle while one CTA walks its tile's pieces one after another.
struct SpecvocabLogitsPlan {
  int32_t wd, wc, mt, ntmax, vec, zs;
  int64_t nsteps;
};

// window_verify's and compact_topk's arguments (window_verify_row.h, compact_topk_row.h).
struct SpecvocabVerifyArgs;
struct SpecvocabTopkArgs;

extern "C" {
const char* specvocab_cuda_error_string(int code);
// The current device's SM count, cached per device (-1 without a device).
int specvocab_sm_count(void);
// Launchers: see each .cu file for the exact contract.
// hidden [M, d] and weight [V, d] (packed: [R * W, d], ids unused) of `dtype`, contiguous; ids [R, W], cnt [R];
// row_to_slot [B] (int64 if slot64, else int32), B dividing M: row m's slot is row_to_slot[m / (M / B)];
// row_map [L] int32 or null (ids to head rows); out [M, W] fp32, every element written; bad: an int64 counter the
// bad table entries are added to, or null. Returns a cudaError_t (0 = launched).
int specvocab_indexed_logits_launch(const void* hidden, const void* weight, const int32_t* ids, const int32_t* cnt,
                                    const void* row_to_slot, int slot64, int64_t B, const int32_t* row_map, int64_t L,
                                    float* out, int64_t* bad, int64_t M, int64_t d, int64_t W, int64_t V, int64_t R,
                                    int dtype, int packed, const SpecvocabLogitsPlan* plan, void* stream);
// window_update and pack_update skip a listed row outside [0, R) (a bad request slot): no out-of-bounds access.
int specvocab_window_update_launch(int32_t* ring, int64_t* length, int32_t* ids, int32_t* cnt, const int64_t* rows,
                                   const int32_t* block, int64_t B, int64_t R, int64_t n, int64_t ring_stride,
                                   int64_t capacity, int32_t fallback_id, int64_t vocab_size, void* stream);
// One verify round of the window policy, its window update included: a block per request. Returns a cudaError_t.
int specvocab_window_verify_launch(const struct SpecvocabVerifyArgs* args, int64_t B, void* stream);
// One block per logits row of compact_topk. Returns a cudaError_t.
int specvocab_compact_topk_launch(const struct SpecvocabTopkArgs* args, void* stream);
int specvocab_pack_update_launch(void* packed, int32_t* packed_ids, const void* weight, const int32_t* ids,
                                 const int32_t* cnt, const int64_t* rows, int32_t* scratch, int64_t B, int64_t R,
                                 int64_t W, int64_t d, int64_t vocab_size, int dtype, void* stream);
}
