// TuneHub's CUDA library peers: C entry points that compute a task's anchor with cuBLAS (GEMM)
// or cuDNN (convolution).
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
//       (fp32 math, no TF32), 1 = float16 in and out, 2 = float16 in, float32 out, 3 = bfloat16
//       in and out, 4 = bfloat16 in, float32 out (all half precision with fp32 accumulation).
//       Returns 0, or the cuBLAS status of a failed call.
//   tunehub_cuda_conv2d_nchw(X, W, Y, n, c, h, w, k, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw,
//                            dtype)
//       Y[n, k, oh, ow] = conv(X[n, c, h, w], W[k, c, kh, kw]), groups 1, zero padding ph / pw on
//       both sides; dtype 0: float32 (FMA math, no TF32), 1: float16 in and out, computed in
//       float32 (cuDNN's pseudo-half configuration, tensor cores allowed):
//       cudnnConvolutionForward with the fastest
//       algorithm cudnnFindConvolutionForwardAlgorithm measures for the shape, found on the
//       first call of a shape and kept (with its workspace) for the process. Returns 0, or the
//       cuDNN status of a failed call.
//
// Stream: the one TVM launches its kernels on for the current device (TVMFFIEnvGetStream), so
// the library call and the epilogue kernel are ordered. One cuBLAS handle per device and thread.
// cuBLAS, the CUDA driver and tvm-ffi are declared here, so no header is needed.
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
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
typedef void* cudnnHandle_t;
typedef void* cudnnTensorDescriptor_t;
typedef void* cudnnFilterDescriptor_t;
typedef void* cudnnConvolutionDescriptor_t;
typedef struct {  // cudnnConvolutionFwdAlgoPerf_t
  int algo;
  int status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
} ConvAlgoPerf;
int cudnnCreate(cudnnHandle_t* handle);
int cudnnSetStream(cudnnHandle_t handle, void* stream);
int cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc);
int cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, int format, int type, int n, int c,
                               int h, int w);
int cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc);
int cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, int type, int format, int k, int c,
                               int h, int w);
int cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc);
int cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w,
                                    int u, int v, int dilation_h, int dilation_w, int mode,
                                    int compute_type);
int cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, int math_type);
int cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                         cudnnFilterDescriptor_t w,
                                         cudnnConvolutionDescriptor_t conv,
                                         cudnnTensorDescriptor_t y, int requested, int* returned,
                                         ConvAlgoPerf* results);
int cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, cudnnTensorDescriptor_t x_desc,
                            const void* x, cudnnFilterDescriptor_t w_desc, const void* w,
                            cudnnConvolutionDescriptor_t conv_desc, int algo, void* workspace,
                            size_t workspace_bytes, const void* beta,
                            cudnnTensorDescriptor_t y_desc, void* y);
int cuCtxGetDevice(int* device);  // the CUDA driver (libcuda), always present with a GPU
int cuMemAlloc_v2(unsigned long long* pointer, size_t bytes);
void* TVMFFIEnvGetStream(int32_t device_type, int32_t device_id);  // tvm-ffi
}

namespace {

enum { kOpN = 0, kOpT = 1 };                      // cublasOperation_t
enum { kR32F = 0, kR16F = 2, kR16BF = 14 };       // cudaDataType_t
enum { kCompute32F = 68 };                        // cublasComputeType_t (no TF32)
enum { kGemmDefault = -1 };                       // cublasGemmAlgo_t
enum { kDLCUDA = 2 };                             // DLDeviceType
enum { kNCHW = 0, kFloat = 0, kHalf = 2, kCrossCorrelation = 1, kTensorOpMath = 1, kFmaMath = 3 };

// One library handle per device and thread, made by Create on first use (nullptr if it fails).
template <int (*Create)(void**)>
void* Handle(int device) {
  thread_local std::unordered_map<int, void*> handles;
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  void* handle = nullptr;
  if (Create(&handle) != 0) return nullptr;
  handles[device] = handle;
  return handle;
}

}  // namespace

extern "C" int tunehub_cuda_gemm(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                 int64_t n, int64_t k, int32_t trans_b, int32_t b_batched,
                                 int32_t dtype) {
  int device = 0;
  cuCtxGetDevice(&device);
  cublasHandle_t handle = Handle<cublasCreate_v2>(device);
  if (handle == nullptr) {
    std::fprintf(stderr, "tunehub_cuda_gemm: cublasCreate failed\n");
    return 1;
  }
  int status = cublasSetStream_v2(handle, TVMFFIEnvGetStream(kDLCUDA, device));
  if (status != 0) return status;
  static const int kIn[] = {kR32F, kR16F, kR16F, kR16BF, kR16BF};
  static const int kOut[] = {kR32F, kR16F, kR32F, kR16BF, kR32F};
  if (dtype < 0 || dtype > 4) {
    std::fprintf(stderr, "tunehub_cuda_gemm: unknown dtype code %d\n", dtype);
    return 1;
  }
  const int in_type = kIn[dtype];
  const int out_type = kOut[dtype];
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

namespace {

// A convolution shape's descriptors, algorithm and workspace, made on its first call.
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

using ConvKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

int MakePlan(cudnnHandle_t handle, const int64_t* d, int half, ConvPlan* plan) {
  // d: n, c, h, w, k, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw
  const int data = half ? kHalf : kFloat;
  int status = cudnnCreateTensorDescriptor(&plan->x);
  if (!status) status = cudnnSetTensor4dDescriptor(plan->x, kNCHW, data, d[0], d[1], d[2], d[3]);
  if (!status) status = cudnnCreateTensorDescriptor(&plan->y);
  if (!status) status = cudnnSetTensor4dDescriptor(plan->y, kNCHW, data, d[0], d[4], d[7], d[8]);
  if (!status) status = cudnnCreateFilterDescriptor(&plan->w);
  if (!status) status = cudnnSetFilter4dDescriptor(plan->w, data, kNCHW, d[4], d[1], d[5], d[6]);
  if (!status) status = cudnnCreateConvolutionDescriptor(&plan->conv);
  if (!status)
    status = cudnnSetConvolution2dDescriptor(plan->conv, d[11], d[12], d[9], d[10], d[13], d[14],
                                             kCrossCorrelation, kFloat);
  if (!status) status = cudnnSetConvolutionMathType(plan->conv, half ? kTensorOpMath : kFmaMath);
  ConvAlgoPerf perf[16];
  int returned = 0;
  if (!status)
    status = cudnnFindConvolutionForwardAlgorithm(handle, plan->x, plan->w, plan->conv, plan->y,
                                                  16, &returned, perf);
  if (status) return status;
  for (int i = 0; i < returned; ++i) {  // fastest first; float32: FMA math only (no TF32)
    if (perf[i].status != 0) continue;
    if (!half && perf[i].math_type != kFmaMath && perf[i].math_type != 0) continue;
    plan->algo = perf[i].algo;
    plan->workspace_bytes = perf[i].memory;
    if (plan->workspace_bytes) {
      unsigned long long pointer = 0;
      if (cuMemAlloc_v2(&pointer, plan->workspace_bytes) != 0) continue;
      plan->workspace = reinterpret_cast<void*>(pointer);
    }
    return 0;
  }
  return -1;
}

}  // namespace

extern "C" int tunehub_cuda_conv2d_nchw(const void* x, const void* w, void* y, int64_t n,
                                        int64_t c, int64_t h, int64_t wd, int64_t k, int64_t kh,
                                        int64_t kw, int64_t oh, int64_t ow, int64_t sh,
                                        int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                                        int64_t dw, int32_t dtype) {
  static std::mutex mutex;
  static std::map<ConvKey, ConvPlan> plans;
  int device = 0;
  cuCtxGetDevice(&device);
  cudnnHandle_t handle = Handle<cudnnCreate>(device);
  if (handle == nullptr) {
    std::fprintf(stderr, "tunehub_cuda_conv2d_nchw: cudnnCreate failed\n");
    return 1;
  }
  int status = cudnnSetStream(handle, TVMFFIEnvGetStream(kDLCUDA, device));
  if (status != 0) return status;
  const int64_t dims[15] = {n, c, h, wd, k, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw};
  const int half = dtype == 1;
  ConvKey key{device * 2 + half, n, c, h, wd, k, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw};
  ConvPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = plans.find(key);
    if (found == plans.end()) {
      ConvPlan made;
      status = MakePlan(handle, dims, half, &made);
      if (status != 0) {
        std::fprintf(stderr, "tunehub_cuda_conv2d_nchw: no cuDNN algorithm (status %d)\n",
                     status);
        return status;
      }
      found = plans.emplace(key, made).first;
    }
    plan = &found->second;
  }
  const float alpha = 1.0f, beta = 0.0f;
  status = cudnnConvolutionForward(handle, &alpha, plan->x, x, plan->w, w, plan->conv, plan->algo,
                                   plan->workspace, plan->workspace_bytes, &beta, plan->y, y);
  if (status != 0) std::fprintf(stderr, "tunehub_cuda_conv2d_nchw: cuDNN status %d\n", status);
  return status;
}
