// TuneHub's library peers: C entry points that compute a task's anchor with OpenBLAS.
//
// A peer PrimFunc calls them with T.call_extern (raw pointers, shapes as constants), so the
// symbols are resolved by the dynamic linker: inside an artifact's model.so, which links this
// object in, or, for a measurement candidate built without it, from libtunehub_peers.so loaded
// RTLD_GLOBAL into the measuring process. No tvm-ffi registry entry is made (one made by a
// library that is later unloaded would dangle).
//
//   tunehub_peer_gemm(A, B, C, batch, M, N, K, trans_b, b_batched)
//       C[b, M, N] = A[b, M, K] x B[b?, K, N]; B is [N, K] when trans_b; with b_batched == 0 one B
//       (a weight) serves every batch (the batch folds into M).
//   tunehub_peer_conv2d_nhwc(X, W, Y, n, H, W, C, KH, KW, O, OH, OW, sh, sw, pt, pl, dh, dw)
//       Y[n, OH, OW, O] = conv(X[n, H, W, C], W[KH, KW, C, O]), zero padding, groups 1: im2col
//       of a block of output rows, then sgemm (a 1x1 stride-1 unpadded conv is one sgemm).
//   tunehub_peer_gemm_packed(...), tunehub_peer_conv2d_nhwc_packed(...)
//       The same arguments, on the shim's own GEMM: the weight packed once into the micro-kernel's
//       panels (cached), AVX-512 or AVX2 + FMA micro-kernels (namespace packed); OpenBLAS where
//       the CPU has neither. tunehub_peer_conv2d_nhwc_winograd's GEMMs use it too.
//   tunehub_peer_gemm_q8(...)
//       tunehub_peer_gemm's arguments, over a weight held in 8 bits (Q8_0's blocks, cached) where
//       the weight's values are exactly on that grid (a model quantized at load); otherwise as
//       the rows' default algorithm (namespace q8).
//   tunehub_peer_gemm_q4(...)
//       the same over llama.cpp's Q4_0 blocks, 4 bits a weight (namespace q4).
//   tunehub_peer_gemm_q8_held(...), tunehub_peer_gemm_q4_held(...)
//       the same over a weight the library holds in the format (tunehub_peer_hold_weight made it
//       when the model was built): no float32 weight, no cache.
//   tunehub_peer_attention(q, k, v, mask, out, B, H, S, D, KV, C, mB, mH, mS, kind, scale)
//       grouped-query attention over a KV cache, reading only the keys the mask lets some query
//       row see (namespace attention).
//   tunehub_peer_depthwise_conv2d_nhwc(X, W, Y, n, H, W, C, KH, KW, C, OH, OW, sh, sw, pt, pl, dh,
//                                      dw)
//       Y[n, OH, OW, C] = depthwise conv(X[n, H, W, C], W[KH, KW, 1, C]), zero padding: vectors
//       along the channels (namespace depthwise); no BLAS.
// Every entry point takes the epilogue's arguments last, (flags, bias, residual, lo, hi): the
// task's bias, residual add and clamp, applied as the output is stored (see Epilogue).
// All tensors are compact float32 on the CPU (a held weight: its bytes). All return 0, but a
// _held GEMM returns 1 for a weight that was not held on the grid (the calling kernel raises).
//
// Threads: the work is split into row blocks run on TVM's own thread pool
// (TVMBackendParallelLaunch), each calling single-threaded sgemm: the library uses exactly the
// threads TVM's kernels use, and OpenBLAS's own pool never competes with TVM's spinning workers.
//
// Sources: this file holds what every kernel shares (the BLAS and TVM's thread pool, declared;
// the ISA choice; ParallelRows) and the C entry points; the kernels are in the files it includes,
// one translation unit (compiler/peers/library.py compiles this file and hashes them all):
//   shim_epilogue.inc      the epilogue applied as outputs are stored (Epilogue)
//   shim_openblas.inc      the GEMM and the im2col convolution on OpenBLAS; ConvShape, Scratch
//   shim_weight_cache.inc  the cache of transformed weights (WeightCache)
//   shim_packed.inc        the packed-weight GEMM and its micro-kernels (namespace packed)
//   shim_winograd.inc      the Winograd convolutions
//   shim_depthwise.inc     the depthwise convolution (namespace depthwise)
//   shim_bf16.inc          the bfloat16 GEMM (namespace bf16)
//   shim_q8.inc            the GEMM over 8-bit weights (namespace q8)
//   shim_q4.inc            the GEMM over 4-bit weights (namespace q4)
//   shim_attention.inc     attention over a KV cache's filled part (namespace attention)
//   shim_onednn.inc        the oneDNN peers (built with -DTUNEHUB_ONEDNN only)
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>  // sysconf: the weight cache's budget

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>  // the packed GEMM's micro-kernels (compiled per ISA by target attributes)
#endif

// Data-parallel loops (the im2col copy, the Winograd transforms) are compiled twice on x86-64
// (target_clones; the dynamic loader picks one by the CPU's features): for AVX + FMA (Intel
// Haswell, AMD Zen and later: 256-bit float vectors, fused multiply-adds) and for the x86-64
// baseline, so that the object linked into an artifact runs on any x86-64. ("arch=haswell"
// would be chosen by CPU model, never on an AMD CPU.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TUNEHUB_SIMD_CLONES __attribute__((target_clones("fma", "default")))
#else
#define TUNEHUB_SIMD_CLONES
#endif
// (their helpers always inlined, so that they are compiled inside each clone)
#define TUNEHUB_INLINE inline __attribute__((always_inline))

// The BLAS: OpenBLAS as the scipy-openblas wheels build it (symbols prefixed ``scipy_``; the
// ILP64 build that numpy bundles adds the suffix ``64_`` and takes 64-bit sizes). Declared here,
// so no header is needed.
#ifdef TUNEHUB_BLAS_ILP64
typedef int64_t blas_int;
#define TUNEHUB_BLAS(name) scipy_##name##64_
#else
typedef int blas_int;
#define TUNEHUB_BLAS(name) scipy_##name
#endif

extern "C" {
void TUNEHUB_BLAS(cblas_sgemm)(int order, int trans_a, int trans_b, blas_int m, blas_int n,
                               blas_int k, float alpha, const float* a, blas_int lda,
                               const float* b, blas_int ldb, float beta, float* c, blas_int ldc);
void TUNEHUB_BLAS(cblas_sgemv)(int order, int trans, blas_int m, blas_int n, float alpha,
                               const float* a, blas_int lda, const float* x, blas_int incx,
                               float beta, float* y, blas_int incy);
void TUNEHUB_BLAS(openblas_set_num_threads)(int num_threads);

// TVM's runtime thread pool (c_backend_api.h), resolved from the TVM runtime in the process.
typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task);
}

namespace {

enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };

// C[m, n] = A[m, k] x B (row-major; B is [k, n], or [n, k] when trans_b is kTrans).
inline void Sgemm(int trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float* c, int64_t ldc) {
  TUNEHUB_BLAS(cblas_sgemm)(kRowMajor, kNoTrans, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
                            ldc);
}

void SingleThreadedBlas() {
  static bool done = false;
  if (!done) {
    TUNEHUB_BLAS(openblas_set_num_threads)(1);
    done = true;
  }
}

// The widest vector ISA the shim's own kernels (the packed GEMM, the depthwise convolution) may
// use here, chosen once per process from the CPU's features. TUNEHUB_PEERS_ISA caps it, so that
// every path can be tested on one machine: "avx2" skips AVX-512; "none" allows none of them (the
// packed GEMM then takes OpenBLAS, the depthwise kernel its baseline build).
enum class Isa { kBaseline, kAvx2, kAvx512 };

Isa PeersIsa() {
  static const Isa isa = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const char* cap = std::getenv("TUNEHUB_PEERS_ISA");
    const std::string wanted = cap ? cap : "";
    if (wanted == "none") return Isa::kBaseline;
    if (wanted != "avx2" && __builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
    return Isa::kBaseline;
  }();
  return isa;
}

// Of a kernel's three builds, the one PeersIsa allows (the baseline one may be null: none).
template <typename Fn>
Fn ForPeersIsa(Fn avx512, Fn avx2, Fn baseline) {
  switch (PeersIsa()) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    default:
      return baseline;
  }
}

// Run body(begin, end) over [0, total) in contiguous blocks of at least min_rows on TVM's pool.
template <typename Body>
void ParallelRows(int64_t total, int64_t min_rows, const Body& body) {
  struct Closure {
    const Body* body;
    int64_t total;
    int64_t min_rows;
  } closure{&body, total, min_rows};
  auto lambda = [](int task_id, TVMParallelGroupEnv* env, void* cdata) -> int {
    auto* c = static_cast<Closure*>(cdata);
    int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(env->num_task, c->total / c->min_rows));
    if (task_id >= tasks) return 0;
    int64_t chunk = (c->total + tasks - 1) / tasks;
    int64_t begin = task_id * chunk, end = std::min(c->total, begin + chunk);
    if (begin < end) (*c->body)(begin, end);
    return 0;
  };
  if (total / min_rows < 2) {
    body(0, total);
    return;
  }
  TVMBackendParallelLaunch(lambda, &closure, 0);
}

}  // namespace

// The kernels, by concept (see the top of this file).
#include "shim_epilogue.inc"
#include "shim_openblas.inc"
#include "shim_weight_cache.inc"
#include "shim_packed.inc"
#include "shim_winograd.inc"
#include "shim_depthwise.inc"
#include "shim_bf16.inc"
#include "shim_q8.inc"
#include "shim_q4.inc"
#include "shim_attention.inc"

// ---------------------------------------------------------------------------------------------
// The C entry points.

#define TUNEHUB_EPILOGUE_ARGS \
  int32_t flags, const float *bias, const float *residual, float lo, float hi
#define TUNEHUB_EPILOGUE Epilogue::Of(flags, bias, residual, lo, hi)

extern "C" int tunehub_peer_gemm(const float* a, const float* b, float* c, int64_t batch,
                                 int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                 int32_t b_batched, int32_t flags, const float* bias,
                                 const float* residual, float lo, float hi) {
  GemmOpenBlas(a, b, c, batch, m, n, k, trans_b, b_batched,
               Epilogue::Of(flags, bias, residual, lo, hi));
  return 0;
}

extern "C" int tunehub_peer_conv2d_nhwc(const float* x, const float* w, float* y, int64_t n,
                                        int64_t h, int64_t wd, int64_t ch, int64_t kh,
                                        int64_t kw, int64_t o, int64_t oh, int64_t ow,
                                        int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                                        int32_t dh, int32_t dw, TUNEHUB_EPILOGUE_ARGS) {
  SingleThreadedBlas();
  ConvIm2col({n, h, wd, ch, kh, kw, o, oh, ow, sh, sw, pt, pl, dh, dw}, x, w, y,
             TUNEHUB_EPILOGUE);
  return 0;
}

extern "C" int tunehub_peer_conv2d_nhwc_winograd(const float* x, const float* w, float* y,
                                                 int64_t n, int64_t h, int64_t wd, int64_t ch,
                                                 int64_t o, int64_t oh, int64_t ow, int32_t pt,
                                                 int32_t pl, int32_t tile,
                                                 TUNEHUB_EPILOGUE_ARGS) {
  SingleThreadedBlas();
  const ConvShape s{n, h, wd, ch, 3, 3, o, oh, ow, 1, 1, pt, pl, 1, 1};
  const Epilogue e = TUNEHUB_EPILOGUE;
  if (tile == 4)
    ConvWinograd<F4>(s, x, w, y, e);
  else if (tile == 2)
    ConvWinograd<F2>(s, x, w, y, e);
  else
    ConvIm2col(s, x, w, y, e);  // not a tile size this shim has: the direct convolution
  return 0;
}

// C = A x B in bfloat16 (bf16::Gemm): the same arguments as tunehub_peer_gemm, A and B
// bfloat16 (uint16) data and C bfloat16. The epilogue arguments are ignored: the matcher fuses
// an epilogue only into a float32 output (compiler/peers/epilogue.py).
extern "C" int tunehub_peer_gemm_bf16(const uint16_t* a, const uint16_t* b, uint16_t* c,
                                      int64_t batch, int64_t m, int64_t n, int64_t k,
                                      int32_t trans_b, int32_t b_batched, int32_t /*flags*/,
                                      const float* /*bias*/, const float* /*residual*/,
                                      float /*lo*/, float /*hi*/) {
  bf16::Gemm(a, b, {nullptr, c}, batch, m, n, k, trans_b != 0, b_batched != 0, Epilogue{});
  return 0;
}

// The same with C in float32 (a bfloat16 linear layer's product before its cast), epilogue
// included.
extern "C" int tunehub_peer_gemm_bf16_f32(const uint16_t* a, const uint16_t* b, float* c,
                                          int64_t batch, int64_t m, int64_t n, int64_t k,
                                          int32_t trans_b, int32_t b_batched,
                                          TUNEHUB_EPILOGUE_ARGS) {
  bf16::Gemm(a, b, {c, nullptr}, batch, m, n, k, trans_b != 0, b_batched != 0,
             TUNEHUB_EPILOGUE);
  return 0;
}

// The same products with packed weights (see namespace packed). A GEMM whose B is not a weight
// (b_batched), or a CPU without the micro-kernels, takes OpenBLAS.
extern "C" int tunehub_peer_gemm_packed(const float* a, const float* b, float* c, int64_t batch,
                                        int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                        int32_t b_batched, TUNEHUB_EPILOGUE_ARGS) {
  const packed::RowsFn rows = packed::Rows();
  const Epilogue e = TUNEHUB_EPILOGUE;
  if (rows == nullptr || b_batched) {
    GemmOpenBlas(a, b, c, batch, m, n, k, trans_b, b_batched, e);
    return 0;
  }
  const WeightCache::Block bp = packed::PackedWeight(b, k, n, trans_b != 0);
  packed::Gemm(rows, batch * m, n, k, a, k, bp->data(), c, n, e);
  return 0;
}

// The same product over a weight held in 8 bits (namespace q8) where the weight is on Q8_0's
// grid; any other B takes what the rows' default algorithm does (OpenBLAS for one row, the
// packed GEMM for more: compiler/peers/algorithms.py).
namespace {
// The 8- and 4-bit GEMMs' entry points, over one format's pieces (q8:: or q4::): C from B's
// cached form where B is on the format's grid, else what the rows' default computes.
template <typename Shape>
int QuantizedOrDefault(bool (*on_grid)(const float*, const Shape&, bool),
                       WeightCache::Block (*cached)(const float*, const Shape&, bool),
                       void (*gemm)(const float*, const float*, float*, int64_t, const Shape&,
                                    const Epilogue&),
                       const float* a, const float* b, float* c, int64_t batch, int64_t m,
                       int64_t n, int64_t k, int32_t trans_b, int32_t b_batched,
                       TUNEHUB_EPILOGUE_ARGS) {
  const Shape s{k, n, (n + q8::kTile - 1) / q8::kTile};  // both formats' tiles and blocks
  if (!b_batched && k % q8::kBlock == 0 && on_grid(b, s, trans_b != 0)) {
    const WeightCache::Block w = cached(b, s, trans_b != 0);
    if ((*w)[0] != 0.0f) {
      gemm(a, w->data(), c, batch * m, s, TUNEHUB_EPILOGUE);
      return 0;
    }
  }
  if (batch * m == 1) {
    GemmOpenBlas(a, b, c, batch, m, n, k, trans_b, b_batched, TUNEHUB_EPILOGUE);
    return 0;
  }
  // the packed GEMM, which takes OpenBLAS itself for a batched B
  return tunehub_peer_gemm_packed(a, b, c, batch, m, n, k, trans_b, b_batched, flags, bias,
                                  residual, lo, hi);
}
}  // namespace

extern "C" int tunehub_peer_gemm_q8(const float* a, const float* b, float* c, int64_t batch,
                                    int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                    int32_t b_batched, TUNEHUB_EPILOGUE_ARGS) {
  return QuantizedOrDefault<q8::Shape>(q8::FirstRunOnGrid, q8::QuantizedWeight, q8::Gemm, a, b,
                                       c, batch, m, n, k, trans_b, b_batched, flags, bias,
                                       residual, lo, hi);
}

extern "C" int tunehub_peer_gemm_q4(const float* a, const float* b, float* c, int64_t batch,
                                    int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                    int32_t b_batched, TUNEHUB_EPILOGUE_ARGS) {
  return QuantizedOrDefault<q4::Shape>(q4::FirstRunOnGrid, q4::QuantizedWeight, q4::Gemm, a, b,
                                       c, batch, m, n, k, trans_b, b_batched, flags, bias,
                                       residual, lo, hi);
}

// Weights held in their format by the library (compiler/peers/held_weights.py): the 8- or
// 4-bit GEMM's cached form of B (format 8: q8's layout, 4: q4's), made once when the model is
// built and passed as the weight argument of tunehub_peer_gemm_q8_held / _q4_held. Such a
// library holds no float32 copy of the weight and no cache entry for it.
namespace {
int64_t HeldTiles(int64_t n) { return (n + q8::kTile - 1) / q8::kTile; }
}  // namespace

// The bytes of B ([k, n] or [n, k]) held in ``format``; 0 when the format cannot hold it (k not
// a multiple of 32, an unknown format).
extern "C" int64_t tunehub_peer_held_bytes(int32_t format, int64_t k, int64_t n) {
  if (k <= 0 || n <= 0 || k % q8::kBlock != 0) return 0;
  size_t floats = 0;
  if (format == 8) floats = q8::Shape{k, n, HeldTiles(n)}.Floats();
  if (format == 4) floats = q4::Shape{k, n, HeldTiles(n)}.Floats();
  return static_cast<int64_t>(floats * sizeof(float));
}

// Writes B held in ``format`` to ``out`` (tunehub_peer_held_bytes bytes, 4-byte aligned, every
// byte written); returns 1 when B is on the format's grid, else 0 (``out`` is then of no use).
extern "C" int32_t tunehub_peer_hold_weight(int32_t format, const float* b, int64_t k, int64_t n,
                                            int32_t trans_b, void* out) {
  const int64_t bytes = tunehub_peer_held_bytes(format, k, n);
  if (bytes == 0) return 0;
  std::memset(out, 0, static_cast<size_t>(bytes));
  auto* w = static_cast<float*>(out);
  const bool on_grid = format == 8 ? q8::Quantize(b, q8::Shape{k, n, HeldTiles(n)}, trans_b, w)
                                   : q4::Quantize(b, q4::Shape{k, n, HeldTiles(n)}, trans_b, w);
  w[0] = on_grid ? 1.0f : 0.0f;
  return on_grid ? 1 : 0;
}

namespace {
// The product over B held by tunehub_peer_hold_weight (``w``) in one format's layout (q8:: or
// q4::): trans_b was fixed when it was held, and a held B is never batched. Returns 1 (the
// calling kernel raises) when ``w`` is not a held B that was on the grid.
template <typename Shape>
int HeldGemm(void (*gemm)(const float*, const float*, float*, int64_t, const Shape&,
                          const Epilogue&),
             const float* a, const float* w, float* c, int64_t batch, int64_t m, int64_t n,
             int64_t k, int32_t b_batched, const Epilogue& e) {
  if (b_batched || k % q8::kBlock != 0 || w[0] != 1.0f) return 1;
  gemm(a, w, c, batch * m, Shape{k, n, HeldTiles(n)}, e);
  return 0;
}
}  // namespace

// tunehub_peer_gemm_q8's product over B held in 8 bits (HeldGemm).
extern "C" int tunehub_peer_gemm_q8_held(const float* a, const float* w, float* c, int64_t batch,
                                         int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                         int32_t b_batched, TUNEHUB_EPILOGUE_ARGS) {
  (void)trans_b;
  return HeldGemm<q8::Shape>(q8::Gemm, a, w, c, batch, m, n, k, b_batched, TUNEHUB_EPILOGUE);
}

// The same over B held in 4 bits (q4's layout).
extern "C" int tunehub_peer_gemm_q4_held(const float* a, const float* w, float* c, int64_t batch,
                                         int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                         int32_t b_batched, TUNEHUB_EPILOGUE_ARGS) {
  (void)trans_b;
  return HeldGemm<q4::Shape>(q4::Gemm, a, w, c, batch, m, n, k, b_batched, TUNEHUB_EPILOGUE);
}

// out[B, H, S, D] = softmax(q k^T * scale + mask) v over the cache's filled part
// (shim_attention.inc); returns 1 (the calling kernel raises) for heads that are not a multiple
// of the cache's heads or a mask kind it does not know.
extern "C" int tunehub_peer_attention(const float* q, const float* k, const float* v,
                                      const void* mask, float* out, int64_t batch, int64_t heads,
                                      int64_t tokens, int64_t dim, int64_t kv_heads,
                                      int64_t capacity, int64_t mask_batch, int64_t mask_heads,
                                      int64_t mask_tokens, int32_t kind, float scale) {
  if (kv_heads <= 0 || heads % kv_heads != 0 || kind < 0 || kind > 2) return 1;
  const attention::Shape s{batch,      heads,      tokens,      dim, kv_heads, capacity,
                           mask_batch, mask_heads, mask_tokens, kind};
  attention::Run(s, q, k, v, mask, out, scale);
  return 0;
}

extern "C" int tunehub_peer_conv2d_nhwc_packed(const float* x, const float* w, float* y,
                                               int64_t n, int64_t h, int64_t wd, int64_t ch,
                                               int64_t kh, int64_t kw, int64_t o, int64_t oh,
                                               int64_t ow, int32_t sh, int32_t sw, int32_t pt,
                                               int32_t pl, int32_t dh, int32_t dw,
                                               TUNEHUB_EPILOGUE_ARGS) {
  const ConvShape s{n, h, wd, ch, kh, kw, o, oh, ow, sh, sw, pt, pl, dh, dw};
  const packed::RowsFn rows = packed::Rows();
  if (rows == nullptr) {
    SingleThreadedBlas();
    ConvIm2col(s, x, w, y, TUNEHUB_EPILOGUE);
  } else {
    packed::Conv(rows, s, x, w, y, TUNEHUB_EPILOGUE);
  }
  return 0;
}

// Y[n, OH, OW, C] = depthwise_conv(X[n, H, W, C], W[KH, KW, 1, C]); ``o`` (= C) is there so
// that the arguments are tunehub_peer_conv2d_nhwc's.
extern "C" int tunehub_peer_depthwise_conv2d_nhwc(const float* x, const float* w, float* y,
                                                  int64_t n, int64_t h, int64_t wd, int64_t ch,
                                                  int64_t kh, int64_t kw, int64_t o, int64_t oh,
                                                  int64_t ow, int32_t sh, int32_t sw,
                                                  int32_t pt, int32_t pl, int32_t dh,
                                                  int32_t dw, TUNEHUB_EPILOGUE_ARGS) {
  static const depthwise::RowsFn rows = depthwise::ChooseRows();
  const ConvShape s{n, h, wd, ch, kh, kw, o, oh, ow, sh, sw, pt, pl, dh, dw};
  const Epilogue e = TUNEHUB_EPILOGUE;
  ParallelRows(n * oh, 1, [&](int64_t r0, int64_t r1) { rows(s, x, w, y, r0, r1, e); });
  return 0;
}

#ifdef TUNEHUB_ONEDNN
#include "shim_onednn.inc"  // the oneDNN peers, where the library was built against oneDNN
#endif

#undef TUNEHUB_EPILOGUE
#undef TUNEHUB_EPILOGUE_ARGS
