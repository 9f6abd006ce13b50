// TuneHub's CUDA library peers: a C entry point that computes a task's GEMM anchor with cuBLAS.
//
// A peer PrimFunc for a CUDA target calls it from its host code with T.call_extern (device
// pointers, shapes as constants); the epilogue stays a TIR kernel launched after it on the same
// stream. As for the CPU shim (shim.cc), the symbol is resolved by the dynamic linker: inside an
// artifact's model.so, which links this object in, or from libtunehub_cuda_peers.so loaded
// RTLD_GLOBAL into a measuring process. No tvm-ffi registry entry is made.
//
//   tunehub_cuda_gemm(A, B, C, batch, M, N, K, trans_b, b_batched, dtype)
//       C[b, M, N] = A[b, M, K] x B[b?, K, N]; B is [N, K] when trans_b; with b_batched == 0 one
//       B (a weight) serves every batch (the batch folds into M). dtype: 0 = float32 in and out
//       (fp32 math, no TF32), 1 = float16 in and out, 2 = float16 in, float32 out (both with
//       fp32 accumulation). Returns 0, or the cuBLAS status of a failed call.
//
// Stream: the one TVM launches its kernels on for the current device (TVMFFIEnvGetStream), so
// the library call and the epilogue kernel are ordered. One cuBLAS handle per device and thread.
// cuBLAS, the CUDA driver and tvm-ffi are declared here, so no header is needed.
#include <cstdint>
#include <cstdio>
#include <unordered_map>

extern "C" {
typedef void* cublasHandle_t;
int cublasCreate_v2(cublasHandle_t* handle);
int cublasSetStream_v2(cublasHandle_t handle, void* stream);
int cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                 const void* alpha, const void* a, int a_type, int lda, const void* b,
                 int b_type, int ldb, const void* beta, void* c, int c_type, int ldc,
                 int compute_type, int algo);
int cublasGemmStridedBatchedEx(cublasHandle_t handle, int transa, int transb, int m, int n,
                               int k, const void* alpha, const void* a, int a_type, int lda,
                               long long stride_a, const void* b, int b_type, int ldb,
                               long long stride_b, const void* beta, void* c, int c_type, int ldc,
                               long long stride_c, int batch_count, int compute_type, int algo);
int cuCtxGetDevice(int* device);  // the CUDA driver (libcuda), always present with a GPU
void* TVMFFIEnvGetStream(int32_t device_type, int32_t device_id);  // tvm-ffi
}

namespace {

enum { kOpN = 0, kOpT = 1 };                      // cublasOperation_t
enum { kR32F = 0, kR16F = 2 };                    // cudaDataType_t
enum { kCompute32F = 68 };                        // cublasComputeType_t (no TF32)
enum { kGemmDefault = -1 };                       // cublasGemmAlgo_t
enum { kDLCUDA = 2 };                             // DLDeviceType

cublasHandle_t Handle(int device) {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  cublasHandle_t handle = nullptr;
  if (cublasCreate_v2(&handle) != 0) return nullptr;
  handles[device] = handle;
  return handle;
}

}  // namespace

extern "C" int tunehub_cuda_gemm(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                 int64_t n, int64_t k, int32_t trans_b, int32_t b_batched,
                                 int32_t dtype) {
  int device = 0;
  cuCtxGetDevice(&device);
  cublasHandle_t handle = Handle(device);
  if (handle == nullptr) {
    std::fprintf(stderr, "tunehub_cuda_gemm: cublasCreate failed\n");
    return 1;
  }
  int status = cublasSetStream_v2(handle, TVMFFIEnvGetStream(kDLCUDA, device));
  if (status != 0) return status;
  const int in_type = dtype == 0 ? kR32F : kR16F;
  const int out_type = dtype == 1 ? kR16F : kR32F;
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C = A x op(B) is column-major C^T = op(B)^T x A^T: cuBLAS gets (B, A) swapped,
  // with B transposed exactly when trans_b is not set.
  const int op_b = trans_b ? kOpT : kOpN;
  const int ldb = trans_b ? static_cast<int>(k) : static_cast<int>(n);
  if (!b_batched) {
    status = cublasGemmEx(handle, op_b, kOpN, n, batch * m, k, &alpha, b, in_type, ldb, a,
                          in_type, k, &beta, c, out_type, n, kCompute32F, kGemmDefault);
  } else {
    status = cublasGemmStridedBatchedEx(handle, op_b, kOpN, n, m, k, &alpha, b, in_type, ldb,
                                        n * k, a, in_type, k, m * k, &beta, c, out_type, n,
                                        m * n, batch, kCompute32F, kGemmDefault);
  }
  if (status != 0) std::fprintf(stderr, "tunehub_cuda_gemm: cuBLAS status %d\n", status);
  return status;
}
