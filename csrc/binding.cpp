// The one TORCH_LIBRARY binding of the specvocab ops: schemas, CPU and CUDA kernels.
// Fake (meta) kernels are registered from Python (each op's module in sglang_specvocab/ops/, via _ext.py).
//
// Refusals. The ops keep TORCH_CHECKs for direct calls, but what the package calls (ops.implementation) runs the
// op's Python check first, so no refusal leaves this library as a C++ exception. On the GPU machines (H100/H200,
// torch 2.11, Python 3.12) the first C++ exception the extension threw in a process crashed it with SIGSEGV
// (four refusal tests in four files, each its file's first throw). Not the cause, with evidence: threads (built
// without -fopenmp, so at::parallel_for runs inline on the caller: no INTRA_OP_PARALLEL, no GOMP symbol in the
// library; every crashing check runs before any loop, and faulthandler showed the main thread); -fno-exceptions
// (not in recipe.py; the library has .gcc_except_table and calls __cxa_throw); a C++11-ABI mismatch (it would
// fail to load: torchCheckFail's std::string mangles by ABI; it loaded and ran 79 GPU tests); the C++ standard
// (torch 2.11 builds its extensions as C++17, as this did). Not reproduced on a CPU machine with the same torch.
// tests/test_kernels.py::test_a_cpp_exception_reaches_python_in_a_fresh_process throws torch's own and this
// library's exception in fresh children, before and after CUDA ran, with a gdb backtrace of the first crash.
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops.h"

namespace specvocab {
namespace {

// SGLANG_DYNVOCAB_DEBUG_CHECKS, read once when the library loads (as ops/checks.py reads it once on import).
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  std::string s = v == nullptr ? "" : v;
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char ch) { return std::isspace(ch); }), s.end());
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

std::atomic<bool> g_debug{env_flag("SGLANG_DYNVOCAB_DEBUG_CHECKS")};

}  // namespace

bool debug_checks() { return g_debug.load(std::memory_order_relaxed); }

void set_debug_checks_op(bool on) { g_debug.store(on); }

void check_rows(const char* op, const at::Tensor& rows_, int64_t R) {
  const at::Tensor rows = rows_.to(at::kCPU).contiguous();  // a host copy: a sync on a GPU (debug setting only)
  const int64_t* r = rows.data_ptr<int64_t>();
  std::vector<int64_t> first(static_cast<size_t>(std::max<int64_t>(R, 0)), -1);
  for (int64_t b = 0; b < rows.numel(); ++b) {
    TORCH_CHECK(r[b] >= 0 && r[b] < R, op, ": rows must be in [0, R=", R, "), got rows[", b, "] = ", r[b]);
    TORCH_CHECK(first[r[b]] < 0, op, ": rows must be distinct, got ", r[b], " twice (rows[", first[r[b]], "] and rows[",
                b, "])");
    first[r[b]] = b;
  }
}

void check_table_entries(const char* op, const at::Tensor* ids_, const at::Tensor& cnt_, const at::Tensor& slot_,
                         int64_t W, int64_t V, int64_t M) {
  // Host copies (a sync on a GPU: debug setting only). The order is ops/checks.py's: the first hidden row with a
  // bad entry, and in it the slot, then the count, then the first bad column.
  const at::Tensor cnt = cnt_.to(at::kCPU).contiguous(), slot = slot_.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor ids = ids_ != nullptr ? ids_->to(at::kCPU).contiguous() : at::Tensor();
  const int64_t R = cnt.size(0), B = slot.size(0), per = B ? std::max<int64_t>(M / B, 1) : 1;
  const int32_t* c = cnt.data_ptr<int32_t>();
  const int64_t* sl = slot.data_ptr<int64_t>();
  for (int64_t m = 0; m < M && B; ++m) {
    const int64_t b = m / per, s = sl[b];
    TORCH_CHECK_VALUE(s >= 0 && s < R, op, ": row_to_slot must be in [0, R=", R, "), got row_to_slot[", b, "] = ", s);
    TORCH_CHECK_VALUE(c[s] >= 1 && c[s] <= W, op, ": cnt must be in [1, W=", W, "], got cnt[", s, "] = ", c[s],
                      " (the slot of hidden row ", m, ")");
    if (!ids.defined()) continue;
    const int32_t* row = ids.data_ptr<int32_t>() + s * W;
    for (int64_t j = 0; j < c[s]; ++j)
      TORCH_CHECK_VALUE(row[j] < V, op, ": ids must be below V=", V, " (a negative id is a dead column), got ids[", s,
                        ", ", j, "] = ", row[j], " (a live column of hidden row ", m, ")");
  }
}

void* current_cuda_stream(const at::Device& device) {
  // c10's virtual device guard answers for CUDA once torch's CUDA library is loaded; going
  // through it keeps this extension free of a link-time dependency on libc10_cuda, so the same
  // sources build against a CPU-only torch (where no CUDA tensor can ever reach this code).
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStream(device).native_handle();
}

void check_launch(int code, const char* op) {
  TORCH_CHECK(code == 0, "specvocab::", op, ": CUDA launch failed: ", specvocab_cuda_error_string(code));
}

}  // namespace specvocab

TORCH_LIBRARY(specvocab, m) {
  // out[m, j] = dot(weight[ids[s, j]], hidden[m]) for j < cnt[s] and ids[s, j] >= 0, else -inf; s = row_to_slot[m].
  // A negative id is a dead column (a set mapped to local head rows, d2t or a TP shard, keeps its slot).
  // An entry that breaks the table's contract (a slot outside [0, R), a count outside [1, W], an id >= V) is read as
  // -inf (table.head_reads) and added to the optional int64 counter `bad`; under the debug setting it is refused.
  // row_to_slot [B], B dividing M: a slot per hidden row or per request of M / B request-major rows. row_map [L]:
  // ids to head rows (-1: none), so a d2t draft's or a TP shard's table is read without a mapped copy.
  m.def(
      "indexed_logits(Tensor hidden, Tensor weight, Tensor ids, Tensor cnt, Tensor row_to_slot, Tensor(a!)? bad=None, "
      "Tensor? row_map=None) -> Tensor");
  m.def("packed_logits(Tensor hidden, Tensor packed, Tensor cnt, Tensor row_to_slot, Tensor(a!)? bad=None) -> Tensor");
  m.def(
      "window_update(Tensor(a!) ring, Tensor(b!) length, Tensor(c!) ids, Tensor(d!) cnt, Tensor rows, Tensor block, "
      "int fallback_id, int vocab_size) -> ()");
  // One verify round of the window policy: entries from SGLang's verify tensors, telemetry into acc, then
  // window_update; returns the committed tokens [B, S] (ops/window_verify.py::reference_window_verify is the
  // definition).
  m.def(
      "window_verify(Tensor(a!) ring, Tensor(b!) length, Tensor(c!) ids, Tensor(d!) cnt, Tensor(e!) acc, Tensor rows, "
      "Tensor draft_token, Tensor accept_index, Tensor accept_lens, Tensor predict, Tensor topk_values, "
      "Tensor topk_ids, Tensor? hot, int k, bool context, bool compacted, int fallback_id, int vocab_size) -> Tensor");
  // The draft head's top-k: per row the top k columns (value descending, then column ascending), their token ids
  // through col_ids (none, [W], or [R, W] with each request's map row in rows), the row's logsumexp; values raw
  // (mode 0), log-probabilities (1) or probabilities (2) (ops/compact_topk.py::reference_compact_topk is the
  // definition).
  m.def(
      "compact_topk(Tensor logits, Tensor? col_ids, Tensor? rows, int k, int fallback_id, int mode) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "pack_update(Tensor(a!) packed, Tensor(b!) packed_ids, Tensor weight, Tensor ids, Tensor cnt, Tensor rows) -> "
      "()");
  // The CUDA launch plan of the logits ops for shapes (tests, benchmarks): [wd, wc, mt, ntmax, vec, nsteps, grid_x,
  // grid_y, grid_z = zs]; sms < 0 asks the current device; per: hidden rows per row_to_slot entry.
  // force_logits_plan(mt, ntmax, zs) overrides the rule's free choices (which never change results) for later calls
  // in this process; 0 keeps the rule's.
  m.def("logits_plan(int M, int W, int d, ScalarType dtype, bool aligned, int sms, int per=1) -> int[]",
        &specvocab::logits_plan_op);
  m.def("force_logits_plan(int mt, int ntmax, int zs=0) -> ()", &specvocab::force_logits_plan_op);
  // The pieces the logits kernels cut row_to_slot into (csrc/pieces.h): [n, 2] of (first row, rows).
  m.def("logits_pieces(Tensor row_to_slot, int P) -> Tensor");
  // The debug setting (SGLANG_DYNVOCAB_DEBUG_CHECKS) for later calls in this process (ops.set_debug_checks).
  m.def("set_debug_checks(bool on) -> ()", &specvocab::set_debug_checks_op);
}

TORCH_LIBRARY_IMPL(specvocab, CPU, m) {
  m.impl("indexed_logits", &specvocab::indexed_logits_cpu);
  m.impl("packed_logits", &specvocab::packed_logits_cpu);
  m.impl("logits_pieces", &specvocab::logits_pieces_op);
  m.impl("window_update", &specvocab::window_update_cpu);
  m.impl("window_verify", &specvocab::window_verify_cpu);
  m.impl("compact_topk", &specvocab::compact_topk_cpu);
  m.impl("pack_update", &specvocab::pack_update_cpu);
}

#ifdef SPECVOCAB_WITH_CUDA  // set by setup.py when nvcc compiled the .cu files
TORCH_LIBRARY_IMPL(specvocab, CUDA, m) {
  m.impl("indexed_logits", &specvocab::indexed_logits_cuda);
  m.impl("packed_logits", &specvocab::packed_logits_cuda);
  m.impl("window_update", &specvocab::window_update_cuda);
  m.impl("window_verify", &specvocab::window_verify_cuda);
  m.impl("compact_topk", &specvocab::compact_topk_cuda);
  m.impl("pack_update", &specvocab::pack_update_cuda);
}
#endif
