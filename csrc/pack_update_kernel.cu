// pack_update on the GPU: one thread block per listed slot, phases separated by __syncthreads.
//
// Semantics (the same as sglang_specvocab/ops/pack_update.py::reference_pack_update and the per-row loop
// tests/literal.py::literal_pack_update; csrc/pack_update.cpp holds the CPU version and the torch-side checks), for
// slot s:
//   c_old = number of packed_ids[s, :] >= 0 (live slots are the prefix [0, c_old));
//   c = cnt[s], N = ids[s, :c] (ascending, distinct);
//   survivor slot j < c_old: packed_ids[s, j] in N; below c it keeps its slot and row (untouched);
//   free slots: j < c that are leaving (j < c_old, id not in N) or dead (j >= c_old), ascending j;
//   fillers: the entering ids (ids[s, k], k < c, not among the old live ids) ascending k, then the
//     survivors at slots j >= c ascending j;
//   the i-th free slot gets the i-th filler: its id, and its row (weight[id] if entering, the
//     survivor's packed row if moved); then packed_ids[s, c:] = -1 (packed[s, c:] is don't care).
// |N| = c = survivors + entering and free = c - survivors below c, so free and fillers are equally
// many. The kernel never reads out of bounds even when the inputs break this contract; a row outside [0, R) (a
// bad request slot) is skipped.
//
// Phase by phase (block of kThreads threads, slot s = rows[blockIdx.x]):
//   (a) c_old by a block reduction over packed_ids[s, :]; clear the shared bitmap;
//   (b) set the bitmap bit of every old live id (membership "is this id old?");
//   (c1) free-slot list, ascending: block-wide exclusive scans over j < c in chunks of kThreads
//        ("is j free?" needs "is packed_ids[s, j] in N?": binary search in ids[s, :c]), written to
//        scratch[b, :n_free] in global memory (W may be 32K, too big for shared memory);
//   (c2) entering ids: scans over k < c in chunks; the filler of rank i goes to free slot
//        scratch[b, i]; its id is written there and (slot, source) is staged in shared memory;
//   (d)  after each chunk of (c2)/(c3), the staged rows are copied by warps (16-byte vectors when
//        the row size and the base pointers allow, scalar otherwise);
//   (c3) movers: scans over j in [c, c_old) for survivors, ranks continuing after the entering ids;
//   (e) packed_ids[s, c:] = -1.
// Why nothing is read after it is overwritten: every write of (c2)/(c3)/(d) goes to a free slot
// < c, whose old id was consumed in (b)/(c1); every source row or id of a mover is at j >= c, which
// only (e) writes, after the last read. Rows are distinct, so blocks never share memory.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

namespace {

// Must match SpecvocabDtype in ops.h (this file includes no torch header, so not ops.h either).
constexpr int kF32 = 0, kF16 = 1, kBF16 = 2;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // above this a kernel must opt in

using BlockReduce = cub::BlockReduce<int, kThreads>;
using BlockScan = cub::BlockScan<int, kThreads>;

struct Shared {
  typename BlockReduce::TempStorage reduce;
  typename BlockScan::TempStorage scan;
  int32_t dst[kThreads];  // staged copies of one chunk: destination slot (-1: skip)
  int32_t src[kThreads];  //   and source: weight row id >= 0, or -1 - j for the packed row at slot j
  int c_old;
};

// Is t in the ascending a[0, n)? (lower bound, then compare)
__device__ __forceinline__ bool contains(const int32_t* a, int n, int32_t t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (a[mid] < t) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && a[lo] == t;
}

// One warp copies one row of d elements; Elem is a same-size unsigned integer (copies are bitwise).
template <typename Elem, bool kVec>
__device__ __forceinline__ void copy_row(Elem* dst, const Elem* src, int64_t d, int lane) {
  if constexpr (kVec) {  // d * sizeof(Elem) % 16 == 0 and 16-byte aligned bases: every row is aligned
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* t = reinterpret_cast<uint4*>(dst);
    const int n = static_cast<int>(d * static_cast<int64_t>(sizeof(Elem)) / 16);
    for (int q = lane; q < n; q += 32) t[q] = s[q];
  } else {
    for (int e = lane; e < d; e += 32) dst[e] = src[e];
  }
}

// (d) Copy the n rows staged by the chunk just scanned, one row per warp at a time.
template <typename Elem, bool kVec>
__device__ __forceinline__ void copy_staged(const Shared& sh, int n, Elem* prow, const Elem* weight, int64_t d,
                                            int64_t vocab_size, int warp, int lane) {
  for (int item = warp; item < n; item += kWarps) {
    const int32_t slot = sh.dst[item], src = sh.src[item];
    if (slot < 0) continue;  // more fillers than free slots: only on input that breaks the contract
    const Elem* from;
    if (src >= 0) {
      if (src >= vocab_size) continue;  // an id out of range (contract broken): read nothing
      from = weight + static_cast<int64_t>(src) * d;
    } else {
      from = prow + (-1 - static_cast<int64_t>(src)) * d;  // a survivor's row at slot >= c
    }
    copy_row<Elem, kVec>(prow + static_cast<int64_t>(slot) * d, from, d, lane);
  }
}

template <typename Elem, bool kVec>
__global__ void __launch_bounds__(kThreads)
    pack_update_kernel(Elem* __restrict__ packed, int32_t* __restrict__ packed_ids, const Elem* __restrict__ weight,
                       const int32_t* __restrict__ ids, const int32_t* __restrict__ cnt,
                       const int64_t* __restrict__ rows, int32_t* __restrict__ scratch, int64_t R, int W, int64_t d,
                       int64_t vocab_size) {
  extern __shared__ uint32_t old_bits[];  // ceil(vocab_size / 32) words: bit t set iff t is an old live id
  __shared__ Shared sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t b = blockIdx.x;
  const int64_t s = rows[b];
  if (s < 0 || s >= R) return;      // the whole block: before any barrier
  int32_t* P = packed_ids + s * W;  // the slot's packed ids, updated in place
  const int32_t* I = ids + s * W;   // N = I[0, c), ascending
  int32_t* free_list = scratch + b * W;
  Elem* prow = packed + s * W * d;
  const int c = min(max(cnt[s], 0), W);
  const int64_t words = (vocab_size + 31) / 32;

  // (a) c_old: the live slots are the prefix of entries >= 0, so counting them gives its length.
  int live = 0;
  for (int j = tid; j < W; j += kThreads) live += P[j] >= 0;
  for (int64_t w = tid; w < words; w += kThreads) old_bits[w] = 0;
  const int live_total = BlockReduce(sh.reduce).Sum(live);  // valid in thread 0 only
  if (tid == 0) sh.c_old = live_total;
  __syncthreads();  // c_old published, bitmap cleared
  const int c_old = sh.c_old;

  // (b) Old live ids into the bitmap (different ids may share a word: atomicOr).
  for (int j = tid; j < c_old; j += kThreads) {
    const int32_t t = P[j];
    if (t >= 0 && t < vocab_size) atomicOr(&old_bits[t >> 5], 1u << (t & 31));
  }
  __syncthreads();  // bitmap complete before (c2) reads it

  // (c1) Free slots j < c (leaving: old id not in N; or dead: j >= c_old), listed in ascending j.
  // Every thread holds the same running n_free: chunk totals come from the scan's block aggregate.
  int n_free = 0;
  for (int base = 0; base < c; base += kThreads) {
    const int j = base + tid;
    const int is_free = j < c && (j >= c_old || !contains(I, c, P[j]));
    int rank, chunk;
    BlockScan(sh.scan).ExclusiveSum(is_free, rank, chunk);
    if (is_free) free_list[n_free + rank] = j;
    n_free += chunk;
    __syncthreads();  // sh.scan is reused by the next scan
  }
  __syncthreads();  // the free list (global memory) is visible to the whole block

  // (c2) + (d) Entering ids (not in the bitmap), ascending k: filler ranks 0 .. n_entering - 1.
  int n_fill = 0;
  for (int base = 0; base < c; base += kThreads) {
    const int k = base + tid;
    const int32_t t = k < c ? I[k] : 0;
    const bool old = t >= 0 && t < vocab_size && ((old_bits[t >> 5] >> (t & 31)) & 1u);
    const int entering = k < c && !old;
    int rank, chunk;
    BlockScan(sh.scan).ExclusiveSum(entering, rank, chunk);
    if (entering) {
      const int i = n_fill + rank;
      const int32_t slot = i < n_free ? free_list[i] : -1;
      if (slot >= 0) P[slot] = t;  // slot < c: a leaving or dead slot, its old id no longer needed
      sh.dst[rank] = slot;
      sh.src[rank] = t;
    }
    n_fill += chunk;
    __syncthreads();  // staging complete
    copy_staged<Elem, kVec>(sh, chunk, prow, weight, d, vocab_size, warp, lane);
    __syncthreads();  // staging and sh.scan free for the next chunk
  }

  // (c3) + (d) Survivors at slots j in [c, c_old) move down: filler ranks continue after the entering ids.
  for (int base = c; base < c_old; base += kThreads) {
    const int j = base + tid;
    const int32_t t = j < c_old ? P[j] : -1;  // j >= c: never written before (e)
    const int moving = j < c_old && contains(I, c, t);
    int rank, chunk;
    BlockScan(sh.scan).ExclusiveSum(moving, rank, chunk);
    if (moving) {
      const int i = n_fill + rank;
      const int32_t slot = i < n_free ? free_list[i] : -1;
      if (slot >= 0) P[slot] = t;
      sh.dst[rank] = slot;
      sh.src[rank] = -1 - j;
    }
    n_fill += chunk;
    __syncthreads();
    copy_staged<Elem, kVec>(sh, chunk, prow, weight, d, vocab_size, warp, lane);
    __syncthreads();
  }
  __syncthreads();  // every read of P[j >= c] is done

  // (e) Slots past the new count are dead.
  for (int j = c + tid; j < W; j += kThreads) P[j] = -1;
}

template <typename Elem, bool kVec>
int launch(void* packed, int32_t* packed_ids, const void* weight, const int32_t* ids, const int32_t* cnt,
           const int64_t* rows, int32_t* scratch, int64_t B, int64_t R, int64_t W, int64_t d, int64_t vocab_size,
           cudaStream_t stream) {
  auto kernel = pack_update_kernel<Elem, kVec>;
  const size_t bitmap_bytes = static_cast<size_t>((vocab_size + 31) / 32) * sizeof(uint32_t);
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  if (bitmap_bytes + attr.sharedSizeBytes > kDefaultSharedBytes) {
    int device = 0, optin = 0;
    if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
    if ((err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) != cudaSuccess) {
      return err;
    }
    // The vocabulary's bitmap does not fit in this device's shared memory (about 1.8M ids on an H100).
    if (bitmap_bytes + attr.sharedSizeBytes > static_cast<size_t>(optin)) return cudaErrorInvalidValue;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bitmap_bytes));
    if (err != cudaSuccess) return err;
  }
  kernel<<<static_cast<unsigned>(B), kThreads, bitmap_bytes, stream>>>(static_cast<Elem*>(packed), packed_ids,
                                                                       static_cast<const Elem*>(weight), ids, cnt, rows,
                                                                       scratch, R, static_cast<int>(W), d, vocab_size);
  return cudaGetLastError();
}

template <typename Elem>
int launch_dtype(void* packed, int32_t* packed_ids, const void* weight, const int32_t* ids, const int32_t* cnt,
                 const int64_t* rows, int32_t* scratch, int64_t B, int64_t R, int64_t W, int64_t d, int64_t vocab_size,
                 cudaStream_t stream) {
  // Rows start at multiples of d * sizeof(Elem) bytes from the bases: 16-byte vectors need both aligned.
  const bool vec = (d * static_cast<int64_t>(sizeof(Elem))) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(packed) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0;
  if (vec)
    return launch<Elem, true>(packed, packed_ids, weight, ids, cnt, rows, scratch, B, R, W, d, vocab_size, stream);
  return launch<Elem, false>(packed, packed_ids, weight, ids, cnt, rows, scratch, B, R, W, d, vocab_size, stream);
}

}  // namespace

// packed [R, W, d] and weight [V = vocab_size, d] of `dtype` (SV_F32/SV_F16/SV_BF16), packed_ids and
// ids [R, W] int32, cnt [R] int32, rows [B] int64 (distinct; one outside [0, R) is skipped), scratch [B, W] int32: all
// contiguous on the current device. Updates the B listed slots on `stream` (a cudaStream_t). Returns a cudaError_t:
// cudaErrorInvalidValue for bad sizes or dtype, or a vocabulary whose bitmap (vocab_size / 8 bytes)
// exceeds the device's shared memory per block; otherwise the launch's error.
extern "C" int specvocab_pack_update_launch(void* packed, int32_t* packed_ids, const void* weight, const int32_t* ids,
                                            const int32_t* cnt, const int64_t* rows, int32_t* scratch, int64_t B,
                                            int64_t R, int64_t W, int64_t d, int64_t vocab_size, int dtype,
                                            void* stream) {
  if (B == 0) return cudaSuccess;
  if (B < 0 || B > INT32_MAX || W < 1 || W > INT32_MAX - kThreads || d < 1 || d > INT32_MAX || vocab_size < 1) {
    return cudaErrorInvalidValue;
  }
  const auto st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kF32:
      return launch_dtype<uint32_t>(packed, packed_ids, weight, ids, cnt, rows, scratch, B, R, W, d, vocab_size, st);
    case kF16:
    case kBF16:
      return launch_dtype<uint16_t>(packed, packed_ids, weight, ids, cnt, rows, scratch, B, R, W, d, vocab_size, st);
    default:
      return cudaErrorInvalidValue;
  }
}
