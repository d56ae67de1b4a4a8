// MicroSpec window update, in place on the GPU: append a block of stream entries to each listed
// request's ring, then publish the request's set (the sorted distinct ids of the ring) into the
// candidate table. Exactly the torch reference (ops/window_update.py::reference_window_update):
//
//   valid entries of block[b, :] are the ids in [0, vocab_size), in order (others are holes);
//   of `count` valid entries only the last `capacity` are kept; kept entry of rank r goes to
//   ring[s, (length[s] + r) % capacity]; length[s] += count;
//   ids[s, :] = sorted distinct valid ids of ring[s, :capacity], then fallback_id; cnt[s] = their
//   number, or 1 (the set {fallback_id}) when the ring holds none.
//
// One block per listed row. The set is built with a bitmap of the vocabulary in shared memory
// (V / 8 bytes: 32 KB at 262k): ring entries set bits, a block-wide scan of per-thread popcounts
// gives each id its column, so the row comes out ascending without a sort. Rows must be distinct; a row outside
// [0, R) (a bad request slot) is skipped: nothing is read or written for it.
#include <cuda_runtime.h>
#include <stdint.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace {

constexpr int kThreads = 512;
using Scan = cub::BlockScan<int, kThreads>;
using Reduce = cub::BlockReduce<int, kThreads>;

__global__ void __launch_bounds__(kThreads)
    window_update_kernel(int32_t* __restrict__ ring, int64_t* __restrict__ length, int32_t* __restrict__ ids,
                         int32_t* __restrict__ cnt, const int64_t* __restrict__ rows, const int32_t* __restrict__ block,
                         int64_t num_rows, int64_t n, int64_t ring_stride, int64_t capacity, int32_t fallback_id,
                         int64_t vocab_size) {
  extern __shared__ uint32_t bitmap[];
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ int shared_int;

  const int t = threadIdx.x;
  const int64_t b = blockIdx.x;
  const int64_t s = rows[b];
  if (s < 0 || s >= num_rows) return;  // the whole block: before any barrier
  const int32_t* entries = block + b * n;
  int32_t* my_ring = ring + s * ring_stride;
  const int64_t len0 = length[s];
  auto valid = [&](int32_t v) { return v >= 0 && static_cast<int64_t>(v) < vocab_size; };

  // 1. How many valid entries this append has.
  int mine = 0;
  for (int64_t i = t; i < n; i += kThreads) mine += valid(entries[i]) ? 1 : 0;
  const int total = Reduce(tmp.reduce).Sum(mine);
  if (t == 0) shared_int = total;
  __syncthreads();
  const int64_t count = shared_int;

  // 2. Append: rank each valid entry (chunked exclusive scan), keep the last `capacity`.
  int64_t base = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kThreads) {
    const int64_t i = c0 + t;
    const int32_t v = i < n ? entries[i] : -1;
    const int flag = valid(v) ? 1 : 0;
    int rank, chunk;
    Scan(tmp.scan).ExclusiveSum(flag, rank, chunk);
    const int64_t r = base + rank;
    if (flag && r >= count - capacity) my_ring[(len0 + r) % capacity] = v;
    base += chunk;
    __syncthreads();  // tmp is reused by the next chunk's scan
  }
  if (t == 0) length[s] = len0 + count;

  // 3. Bitmap of the ring's ids (the ring writes above are visible after the barrier).
  const int64_t words = (vocab_size + 31) / 32;
  for (int64_t w = t; w < words; w += kThreads) bitmap[w] = 0u;
  __syncthreads();
  for (int64_t p = t; p < capacity; p += kThreads) {
    const int32_t v = my_ring[p];
    if (valid(v)) atomicOr(&bitmap[v >> 5], 1u << (v & 31));
  }
  __syncthreads();

  // 4. Each thread owns a contiguous range of words; a scan of their popcounts places its ids.
  const int64_t per = (words + kThreads - 1) / kThreads;
  const int64_t w0 = min(static_cast<int64_t>(t) * per, words);
  const int64_t w1 = min(w0 + per, words);
  int pop = 0;
  for (int64_t w = w0; w < w1; ++w) pop += __popc(bitmap[w]);
  int offset, distinct;
  Scan(tmp.scan).ExclusiveSum(pop, offset, distinct);
  int32_t* my_ids = ids + s * capacity;
  int64_t col = offset;
  for (int64_t w = w0; w < w1; ++w) {
    uint32_t bits = bitmap[w];
    while (bits) {
      const int bit = __ffs(bits) - 1;
      bits &= bits - 1;
      if (col < capacity) my_ids[col] = static_cast<int32_t>(w * 32 + bit);
      ++col;
    }
  }
  for (int64_t j = distinct + t; j < capacity; j += kThreads) my_ids[j] = fallback_id;
  if (t == 0) {
    if (distinct == 0) my_ids[0] = fallback_id;
    cnt[s] = distinct > 0 ? distinct : 1;
  }
}

}  // namespace

extern "C" int specvocab_window_update_launch(int32_t* ring, int64_t* length, int32_t* ids, int32_t* cnt,
                                              const int64_t* rows, const int32_t* block, int64_t B, int64_t R,
                                              int64_t n, int64_t ring_stride, int64_t capacity, int32_t fallback_id,
                                              int64_t vocab_size, void* stream) {
  if (B == 0) return 0;
  const size_t smem = static_cast<size_t>((vocab_size + 31) / 32) * sizeof(uint32_t);
  // The 48 KB a block gets without opting in holds the static scan storage (about 2 KB) too: a bitmap just
  // under 48 KB (vocab_size about 375k-393k) must opt in as well.
  // That storage is a property of the compiled kernel: asked once, not in every verify round.
  static const size_t static_smem = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, window_update_kernel) == cudaSuccess) return attr.sharedSizeBytes;
    cudaGetLastError();       // not left for the launch check below to report
    return size_t{8 * 1024};  // a safe bound on the scan storage
  }();
  if (smem + static_smem > 48 * 1024) {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (smem + static_smem > static_cast<size_t>(optin)) return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t err =
        cudaFuncSetAttribute(window_update_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  window_update_kernel<<<static_cast<unsigned>(B), kThreads, smem, static_cast<cudaStream_t>(stream)>>>(
      ring, length, ids, cnt, rows, block, R, n, ring_stride, capacity, fallback_id, vocab_size);
  return static_cast<int>(cudaGetLastError());
}
