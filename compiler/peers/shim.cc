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
//   tunehub_peer_depthwise_conv2d_nhwc(X, W, Y, n, H, W, C, KH, KW, C, OH, OW, sh, sw, pt, pl, dh,
//                                      dw)
//       Y[n, OH, OW, C] = depthwise conv(X[n, H, W, C], W[KH, KW, 1, C]), zero padding: vectors
//       along the channels (namespace depthwise); no BLAS.
// Every entry point takes the epilogue's arguments last, (flags, bias, residual, lo, hi): the
// task's bias, residual add and clamp, applied as the output is stored (see Epilogue).
// All tensors are compact float32 on the CPU. All return 0.
//
// Threads: the work is split into row blocks run on TVM's own thread pool
// (TVMBackendParallelLaunch), each calling single-threaded sgemm: the library uses exactly the
// threads TVM's kernels use, and OpenBLAS's own pool never competes with TVM's spinning workers.
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

// ---------------------------------------------------------------------------------------------
// The epilogue a peer applies to its product as it stores it: the task's bias, residual add and
// clamp (ReLU, ReLU6), when the task's epilogue begins with them (compiler/peers/rewrite.py
// decides; what follows stays a TIR loop after the call). Over the output seen as a
// [rows, channels] matrix (rows: output pixels, or a GEMM's rows):
//   Y[r, c] = min(max(P[r, c] + bias[c] + residual[r, c], lo), hi)
// Applied block by block while the block is still in cache, it saves the separate pass over the
// output that a TIR epilogue after the call makes: on memory-bound convolutions (a 1x1 expansion
// of few channels into many, a depthwise convolution) that pass costs as much as the product.
//
// Every entry point ends with the epilogue's arguments: (flags, bias, residual, lo, hi); flags
// bit 0: bias given, bit 1: residual given (a pointer not given is not read); lo, hi: -inf and
// +inf for no clamp.

namespace {

struct Epilogue {
  const float* bias = nullptr;      // [channels]
  const float* residual = nullptr;  // the output's layout, rows from this view's row 0
  float lo = -INFINITY, hi = INFINITY;

  static Epilogue Of(int32_t flags, const float* bias, const float* residual, float lo,
                     float hi) {
    return {flags & 1 ? bias : nullptr, flags & 2 ? residual : nullptr, lo, hi};
  }
  bool empty() const {
    return bias == nullptr && residual == nullptr && lo == -INFINITY && hi == INFINITY;
  }
  // The same epilogue for the view of the output that starts ``rows`` rows down (ld floats a row).
  Epilogue Down(int64_t rows, int64_t ld) const {
    Epilogue e = *this;
    if (residual != nullptr) e.residual = residual + rows * ld;
    return e;
  }
};

// y[r, c] for r in [r0, r1), c in [c0, c1) (ld floats a row), in place.
TUNEHUB_SIMD_CLONES void ApplyEpilogue(const Epilogue& e, float* y, int64_t ld, int64_t r0,
                                       int64_t r1, int64_t c0, int64_t c1) {
  if (e.empty()) return;
  const float lo = e.lo, hi = e.hi;
  for (int64_t r = r0; r < r1; ++r) {
    float* row = y + r * ld;
    const float* res = e.residual ? e.residual + r * ld : nullptr;
    // one loop per case, so that each vectorizes without tests inside
    if (e.bias && res) {
      for (int64_t c = c0; c < c1; ++c)
        row[c] = std::min(std::max(row[c] + e.bias[c] + res[c], lo), hi);
    } else if (e.bias) {
      for (int64_t c = c0; c < c1; ++c) row[c] = std::min(std::max(row[c] + e.bias[c], lo), hi);
    } else if (res) {
      for (int64_t c = c0; c < c1; ++c) row[c] = std::min(std::max(row[c] + res[c], lo), hi);
    } else {
      for (int64_t c = c0; c < c1; ++c) row[c] = std::min(std::max(row[c], lo), hi);
    }
  }
}

// C[b, M, N] = A[b, M, K] x B on OpenBLAS (see tunehub_peer_gemm), the epilogue per block.
void GemmOpenBlas(const float* a, const float* b, float* c, int64_t batch, int64_t m, int64_t n,
                  int64_t k, int32_t trans_b, int32_t b_batched, const Epilogue& e) {
  SingleThreadedBlas();
  const int tb = trans_b ? kTrans : kNoTrans;
  const int64_t ldb = trans_b ? k : n;
  if (!b_batched) {
    const int64_t rows = batch * m;
    if (rows == 1) {  // a matrix-vector product: sgemv over blocks of output columns
      ParallelRows(n, 64, [&](int64_t c0, int64_t c1) {
        if (trans_b)  // c[c0:c1] = B[c0:c1, :] a
          TUNEHUB_BLAS(cblas_sgemv)(kRowMajor, kNoTrans, c1 - c0, k, 1.0f, b + c0 * k, k, a, 1,
                                    0.0f, c + c0, 1);
        else  // c[c0:c1] = B[:, c0:c1]^T a
          TUNEHUB_BLAS(cblas_sgemv)(kRowMajor, kTrans, k, c1 - c0, 1.0f, b + c0, n, a, 1, 0.0f,
                                    c + c0, 1);
        ApplyEpilogue(e, c, n, 0, 1, c0, c1);
      });
    } else if (rows >= 16) {  // split rows
      ParallelRows(rows, 8, [&](int64_t r0, int64_t r1) {
        Sgemm(tb, r1 - r0, n, k, a + r0 * k, k, b, ldb, c + r0 * n, n);
        ApplyEpilogue(e, c, n, r0, r1, 0, n);
      });
    } else {  // a GEMV-like product: split columns
      ParallelRows(n, 64, [&](int64_t c0, int64_t c1) {
        Sgemm(tb, rows, c1 - c0, k, a, k, trans_b ? b + c0 * k : b + c0, ldb, c + c0, n);
        ApplyEpilogue(e, c, n, 0, rows, c0, c1);
      });
    }
    return;
  }
  ParallelRows(batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      Sgemm(tb, m, n, k, a + i * m * k, k, b + i * k * n, ldb, c + i * m * n, n);
      ApplyEpilogue(e, c, n, i * m, (i + 1) * m, 0, n);
    }
  });
}
}  // namespace

extern "C" int tunehub_peer_gemm(const float* a, const float* b, float* c, int64_t batch,
                                 int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                 int32_t b_batched, int32_t flags, const float* bias,
                                 const float* residual, float lo, float hi) {
  GemmOpenBlas(a, b, c, batch, m, n, k, trans_b, b_batched,
               Epilogue::Of(flags, bias, residual, lo, hi));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Convolution, NHWC input, HWIO weight, zero padding, groups 1.

namespace {

struct ConvShape {
  int64_t n, h, w, c;    // input [n, h, w, c]
  int64_t kh, kw, o;     // weight [kh, kw, c, o]
  int64_t oh, ow;        // output [n, oh, ow, o]
  int64_t sh, sw, pt, pl, dh, dw;

  // A 1x1, stride-1, unpadded convolution: one GEMM of the input as it is, no im2col.
  bool pointwise() const {
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0;
  }
};

// Below this many output pixels a convolution im2cols all of them at once and splits the GEMM
// by output channels (or blocks) instead of by pixel rows.
constexpr int64_t kFewPixels = 512;

// im2col of output pixels [r0, r1) (row r: image r / (oh*ow), pixel r % (oh*ow)) into `cols`,
// one row of k = kh*kw*c floats per pixel in the weight's (ky, kx, c) order.
//
// With dilation_w 1 the kw taps of one kernel row read kw*c contiguous input floats, whatever
// the stride (the stride only spaces the output pixels): each kernel row is one run, clipped at
// the image's left and right edges, with zeros outside. This is what makes a 3-channel stem fast
// (a 7x7 kernel row is one run of 21 floats instead of 7 copies of 3). With dilation_w > 1 each
// tap is its own run of c floats.
TUNEHUB_SIMD_CLONES void Im2col(const ConvShape& s, const float* x, int64_t r0, int64_t r1,
                                float* cols) {
  const int64_t k = s.kh * s.kw * s.c, pixels = s.oh * s.ow, run = s.kw * s.c;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t image = r / pixels, py = (r % pixels) / s.ow, px = r % s.ow;
    const float* src = x + image * s.h * s.w * s.c;
    float* row = cols + (r - r0) * k;
    const int64_t ix0 = px * s.sw - s.pl;
    for (int64_t ky = 0; ky < s.kh; ++ky) {
      const int64_t iy = py * s.sh - s.pt + ky * s.dh;
      float* dst = row + ky * run;
      if (iy < 0 || iy >= s.h) {
        std::fill(dst, dst + run, 0.0f);
        continue;
      }
      const float* line = src + iy * s.w * s.c;
      if (s.dw == 1) {
        // taps kx in [kx0, kx1) are inside the image
        const int64_t kx0 = std::min<int64_t>(s.kw, std::max<int64_t>(0, -ix0));
        const int64_t kx1 = std::max<int64_t>(kx0, std::min<int64_t>(s.kw, s.w - ix0));
        std::fill(dst, dst + kx0 * s.c, 0.0f);
        const float* in = line + (ix0 + kx0) * s.c;
        float* out = dst + kx0 * s.c;
        for (int64_t i = 0, len = (kx1 - kx0) * s.c; i < len; ++i) out[i] = in[i];
        std::fill(dst + kx1 * s.c, dst + run, 0.0f);
      } else {
        for (int64_t kx = 0; kx < s.kw; ++kx) {
          const int64_t ix = ix0 + kx * s.dw;
          float* out = dst + kx * s.c;
          if (ix < 0 || ix >= s.w) {
            std::fill(out, out + s.c, 0.0f);
          } else {
            const float* in = line + ix * s.c;
            for (int64_t i = 0; i < s.c; ++i) out[i] = in[i];
          }
        }
      }
    }
  }
}

// The caller's scratch memory, kept between calls (a fresh allocation of megabytes per call is
// an mmap whose pages fault in again on every call). Worker threads use it through the
// closure, only during the call.
float* Scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(static_cast<size_t>(floats));
  return buffer.data();
}

// Direct convolution as im2col + sgemm.
//   Many output pixels (>= kFewPixels): row blocks per task, each im2col'd kTileRows rows at a
//   time (the column block stays in cache) and multiplied by the whole weight.
//   Few output pixels (deep layers: 14x14, 7x7): all rows im2col'd once (in parallel), then the
//   product split by output channels, so that each task reads only its slice of the (large)
//   weight instead of every task reading all of it.
void ConvIm2col(const ConvShape& s, const float* x, const float* w, float* y,
                const Epilogue& e) {
  const int64_t k = s.kh * s.kw * s.c, rows = s.n * s.oh * s.ow;
  if (s.pointwise()) {
    ParallelRows(rows, 8, [&](int64_t r0, int64_t r1) {
      Sgemm(kNoTrans, r1 - r0, s.o, s.c, x + r0 * s.c, s.c, w, s.o, y + r0 * s.o, s.o);
      ApplyEpilogue(e, y, s.o, r0, r1, 0, s.o);
    });
    return;
  }
  constexpr int64_t kTileRows = 256;
  if (rows < kFewPixels && s.o >= 64) {
    float* cols = Scratch(0, rows * k);
    ParallelRows(rows, 8, [&](int64_t r0, int64_t r1) { Im2col(s, x, r0, r1, cols + r0 * k); });
    ParallelRows(s.o, 32, [&](int64_t c0, int64_t c1) {
      Sgemm(kNoTrans, rows, c1 - c0, k, cols, k, w + c0, s.o, y + c0, s.o);
      ApplyEpilogue(e, y, s.o, 0, rows, c0, c1);
    });
    return;
  }
  ParallelRows(rows, 8, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> cols;
    cols.resize(static_cast<size_t>(std::min(kTileRows, r1 - r0) * k));
    for (int64_t t0 = r0; t0 < r1; t0 += kTileRows) {
      const int64_t t1 = std::min(r1, t0 + kTileRows);
      Im2col(s, x, t0, t1, cols.data());
      Sgemm(kNoTrans, t1 - t0, s.o, k, cols.data(), k, w, s.o, y + t0 * s.o, s.o);
      ApplyEpilogue(e, y, s.o, t0, t1, 0, s.o);
    }
  });
}

// The cache of transformed weights (Winograd's U, packed GEMM panels), keyed by what the
// transform is (``kind``, ``dims``) and by the weight's address.
//
// Contract: a weight is a constant. An entry also keeps kSamples of the weight's values (spread
// over the whole tensor) and is used only when they still match bit for bit, so a different
// tensor later allocated at the same address (a measurement's fresh random arguments, another
// model's weight) is transformed anew; a weight changed in place but only between the samples
// would be served stale. Entries are evicted least recently used beyond kCacheBytes.
class WeightCache {
 public:
  using Block = std::shared_ptr<const std::vector<float>>;
  enum Kind {
    kWinogradF2 = 2,
    kWinogradF4 = 4,
    kWinogradF2Packed = 3,
    kWinogradF4Packed = 5,
    kPacked = 16,
    kPackedTransposed = 17,
    kOneDnn = 32  // a oneDNN primitive's weight layout (shim_onednn.inc)
  };

  // The transform of weight ``w`` (``size`` floats) into ``floats`` floats, made by
  // ``fill(out)`` on a miss.
  template <typename Fill>
  static Block Get(Kind kind, const float* w, int64_t size, int64_t d0, int64_t d1,
                   int64_t floats, const Fill& fill) {
    static WeightCache cache;
    Key key{w, kind, d0, d1, Samples(w, size)};
    {
      std::lock_guard<std::mutex> lock(cache.mu_);
      if (Block hit = cache.FindLocked(key)) return hit;
    }
    auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(floats));
    fill(out->data());
    std::lock_guard<std::mutex> lock(cache.mu_);
    if (Block hit = cache.FindLocked(key)) return hit;  // another thread was faster
    cache.entries_.push_front({key, out});
    cache.bytes_ += out->size() * sizeof(float);
    while (cache.bytes_ > kCacheBytes && cache.entries_.size() > 1) {
      cache.bytes_ -= cache.entries_.back().block->size() * sizeof(float);
      cache.entries_.pop_back();
    }
    return out;
  }

 private:
  static constexpr size_t kCacheBytes = size_t{1} << 30;
  static constexpr int kSamples = 64;

  struct Key {
    const float* w;
    Kind kind;
    int64_t d0, d1;
    std::array<uint32_t, kSamples> samples;
    bool operator==(const Key& other) const {
      return w == other.w && kind == other.kind && d0 == other.d0 && d1 == other.d1 &&
             samples == other.samples;
    }
  };
  struct Entry {
    Key key;
    Block block;
  };

  static std::array<uint32_t, kSamples> Samples(const float* w, int64_t size) {
    std::array<uint32_t, kSamples> out{};
    for (int i = 0; i < kSamples; ++i)
      std::memcpy(&out[i], w + (size - 1) * i / (kSamples - 1), sizeof(uint32_t));
    return out;
  }

  Block FindLocked(const Key& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->key == key) {
        entries_.splice(entries_.begin(), entries_, it);  // most recently used first
        return entries_.front().block;
      }
    }
    return nullptr;
  }

  std::mutex mu_;
  std::list<Entry> entries_;
  size_t bytes_ = 0;
};

// ---------------------------------------------------------------------------------------------
// GEMM with packed weights: C[M, N] = A[M, K] x B, B a constant weight ([K, N], or [N, K]
// transposed) packed once into panels of kNR columns, Bp[panel][k][kNR] (zero past N), and kept
// in the WeightCache. OpenBLAS packs B again on every call and handles few rows poorly; the
// products of inference (a few to a few thousand rows against a fixed weight) are exactly that
// case (bench/results/gemm_packed_2026-12-02.md: 0.37-0.98x OpenBLAS's time on ResNet-18's,
// BERT's and a decoder's shapes at 2 threads).
//
// A micro-kernel computes rows of A against one panel, k in blocks of kKC, the accumulators in
// registers: AVX-512 12 rows x 32 columns (24 zmm), AVX2 + FMA 6 rows x 16 columns (12 ymm,
// each panel in two halves); each step broadcasts one element of A per row and multiplies it
// with the panel's row of B. Which one runs is chosen once from the CPU's features; on a CPU
// with neither (or not x86-64), the packed entry points fall back to OpenBLAS.

namespace packed {

constexpr int64_t kNR = 32, kKC = 256, kMC = 96;  // panel width, k block, rows per block
// Gemm's order: below this many bytes of weight, row blocks over the tasks (see Gemm).
constexpr int64_t kSmallWeightBytes = 256 << 10;

// rows [0, m) of A (lda) x one panel block bp (kc x kNR) into C (ldc), ``ncols`` <= kNR valid
// columns; adds to C unless ``first``.
using RowsFn = void (*)(int64_t m, int64_t kc, const float* a, int64_t lda, const float* bp,
                        float* c, int64_t ldc, bool first, int64_t ncols);

#if defined(__x86_64__) && defined(__GNUC__)
template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Kernel512(
    int64_t kc, const float* a, int64_t lda, const float* bp, float* c, int64_t ldc, bool first,
    int64_t ncols) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * kNR), b1 = _mm512_loadu_ps(bp + k * kNR + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  const __mmask16 m0 = ncols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << ncols) - 1);
  const __mmask16 m1 = ncols >= 32   ? 0xFFFF
                       : ncols <= 16 ? 0
                                     : static_cast<__mmask16>((1u << (ncols - 16)) - 1);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
    if (!first) {
      acc0[r] = _mm512_add_ps(acc0[r], _mm512_maskz_loadu_ps(m0, row));
      acc1[r] = _mm512_add_ps(acc1[r], _mm512_maskz_loadu_ps(m1, row + 16));
    }
    _mm512_mask_storeu_ps(row, m0, acc0[r]);
    _mm512_mask_storeu_ps(row + 16, m1, acc1[r]);
  }
}

__attribute__((target("avx512f"))) void Rows512(int64_t m, int64_t kc, const float* a,
                                                int64_t lda, const float* bp, float* c,
                                                int64_t ldc, bool first, int64_t ncols) {
  int64_t i = 0;
  for (; i + 12 <= m; i += 12)
    Kernel512<12>(kc, a + i * lda, lda, bp, c + i * ldc, ldc, first, ncols);
  a += i * lda;
  c += i * ldc;
  switch (m - i) {
#define TUNEHUB_ROWS(R) \
  case R:               \
    Kernel512<R>(kc, a, lda, bp, c, ldc, first, ncols); \
    break;
    TUNEHUB_ROWS(1) TUNEHUB_ROWS(2) TUNEHUB_ROWS(3) TUNEHUB_ROWS(4) TUNEHUB_ROWS(5)
    TUNEHUB_ROWS(6) TUNEHUB_ROWS(7) TUNEHUB_ROWS(8) TUNEHUB_ROWS(9) TUNEHUB_ROWS(10)
    TUNEHUB_ROWS(11)
    default:
      break;
  }
}

// 16 columns (one half of a panel: bp and c already offset), ``ncols`` <= 16 valid.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Kernel256(
    int64_t kc, const float* a, int64_t lda, const float* bp, float* c, int64_t ldc, bool first,
    int64_t ncols) {
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * kNR), b1 = _mm256_loadu_ps(bp + k * kNR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  // masked loads and stores (an array indexed at run time would keep the accumulators in
  // memory instead of registers)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols)), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols) - 8), lane);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
    if (!first) {
      acc0[r] = _mm256_add_ps(acc0[r], _mm256_maskload_ps(row, m0));
      acc1[r] = _mm256_add_ps(acc1[r], _mm256_maskload_ps(row + 8, m1));
    }
    _mm256_maskstore_ps(row, m0, acc0[r]);
    _mm256_maskstore_ps(row + 8, m1, acc1[r]);
  }
}

__attribute__((target("avx2,fma"))) void Rows256(int64_t m, int64_t kc, const float* a,
                                                 int64_t lda, const float* bp, float* c,
                                                 int64_t ldc, bool first, int64_t ncols) {
  for (int64_t half = 0; half < 2 && half * 16 < ncols; ++half) {
    const float* b = bp + half * 16;
    float* ch = c + half * 16;
    const int64_t nc = std::min<int64_t>(16, ncols - half * 16);
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) Kernel256<6>(kc, a + i * lda, lda, b, ch + i * ldc, ldc, first, nc);
    const float* ar = a + i * lda;
    float* cr = ch + i * ldc;
    switch (m - i) {
#define TUNEHUB_ROWS2(R) \
  case R:                \
    Kernel256<R>(kc, ar, lda, b, cr, ldc, first, nc); \
    break;
      TUNEHUB_ROWS2(1) TUNEHUB_ROWS2(2) TUNEHUB_ROWS2(3) TUNEHUB_ROWS2(4) TUNEHUB_ROWS2(5)
      default:
        break;
    }
  }
}
#undef TUNEHUB_ROWS
#undef TUNEHUB_ROWS2

// PeersIsa's micro-kernel; none (OpenBLAS) on the baseline.
RowsFn ChooseRows() { return ForPeersIsa<RowsFn>(Rows512, Rows256, nullptr); }
#else
RowsFn ChooseRows() { return nullptr; }
#endif

// This CPU's micro-kernel, or nullptr (then the callers use OpenBLAS).
RowsFn Rows() {
  static const RowsFn rows = ChooseRows();
  return rows;
}

int64_t Panels(int64_t n) { return (n + kNR - 1) / kNR; }

// B ([k, n], or [n, k] when ``trans``) packed into panels [p0, p1) of ``bp``.
void PackPanels(const float* b, int64_t k, int64_t n, bool trans, int64_t p0, int64_t p1,
                float* bp) {
  for (int64_t p = p0; p < p1; ++p) {
    float* dst = bp + p * k * kNR;
    const int64_t c0 = p * kNR, cols = std::min(kNR, n - c0);
    for (int64_t kk = 0; kk < k; ++kk) {
      float* row = dst + kk * kNR;
      for (int64_t j = 0; j < cols; ++j) row[j] = trans ? b[(c0 + j) * k + kk] : b[kk * n + c0 + j];
      std::fill(row + cols, row + kNR, 0.0f);
    }
  }
}

// All of B packed into ``bp`` (serial).
void Pack(const float* b, int64_t k, int64_t n, bool trans, float* bp) {
  PackPanels(b, k, n, trans, 0, Panels(n), bp);
}

// B packed into panels (cached; see WeightCache).
WeightCache::Block PackedWeight(const float* b, int64_t k, int64_t n, bool trans) {
  return WeightCache::Get(
      trans ? WeightCache::kPackedTransposed : WeightCache::kPacked, b, k * n, k, n,
      Panels(n) * k * kNR, [&](float* bp) {
        ParallelRows(Panels(n), 1, [&](int64_t p0, int64_t p1) {
          PackPanels(b, k, n, trans, p0, p1, bp);
        });
      });
}

// C[r0:r1, panels p0:p1] (serial).
void Multiply(RowsFn rows, int64_t r0, int64_t r1, int64_t p0, int64_t p1, int64_t n, int64_t k,
              const float* a, int64_t lda, const float* bp, float* c, int64_t ldc,
              const Epilogue& e = Epilogue()) {
  for (int64_t m0 = r0; m0 < r1; m0 += kMC) {
    const int64_t m1 = std::min(r1, m0 + kMC);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c0 = p * kNR;
      for (int64_t k0 = 0; k0 < k; k0 += kKC)
        rows(m1 - m0, std::min(kKC, k - k0), a + m0 * lda + k0, lda, bp + (p * k + k0) * kNR,
             c + m0 * ldc + c0, ldc, k0 == 0, std::min(kNR, n - c0));
      ApplyEpilogue(e, c, ldc, m0, m1, c0, std::min(n, c0 + kNR));
    }
  }
}

// C[M, N] = A[M, K] x Bp on TVM's pool: blocks of kMC rows x one panel, panel-major, in
// contiguous ranges per task (a task keeps its panels in cache across row blocks); with a small
// weight and many rows, whole row blocks per task instead.
void Gemm(RowsFn rows, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* bp, float* c, int64_t ldc, const Epilogue& e) {
  const int64_t row_blocks = (m + kMC - 1) / kMC, blocks = row_blocks * Panels(n);
  const auto body = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t p = b / row_blocks, r0 = (b % row_blocks) * kMC;
      Multiply(rows, r0, std::min(m, r0 + kMC), p, p + 1, n, k, a, lda, bp, c, ldc, e);
    }
  };
  if (m * n * k < (int64_t{1} << 16)) {  // too little work to share
    body(0, blocks);
    return;
  }
  if (k * n * static_cast<int64_t>(sizeof(float)) <= kSmallWeightBytes && row_blocks >= 4) {
    // A small weight (a 1x1 convolution of few input channels) stays in cache whatever the
    // order: row blocks over the tasks, each against every panel, read A and write C once.
    ParallelRows(row_blocks, 1, [&](int64_t b0, int64_t b1) {
      Multiply(rows, b0 * kMC, std::min(m, b1 * kMC), 0, Panels(n), n, k, a, lda, bp, c, ldc,
               e);
    });
    return;
  }
  ParallelRows(blocks, 1, body);
}

// The convolution as im2col + packed GEMM (same cases as ConvIm2col).
void Conv(RowsFn rows, const ConvShape& s, const float* x, const float* w, float* y,
          const Epilogue& e) {
  const int64_t k = s.kh * s.kw * s.c, npix = s.n * s.oh * s.ow;
  const WeightCache::Block bp = PackedWeight(w, k, s.o, false);
  if (s.pointwise()) {
    Gemm(rows, npix, s.o, s.c, x, s.c, bp->data(), y, s.o, e);
    return;
  }
  if (npix < kFewPixels) {  // few pixels: im2col all of them, then share the GEMM's blocks
    float* cols = Scratch(0, npix * k);
    ParallelRows(npix, 8, [&](int64_t r0, int64_t r1) { Im2col(s, x, r0, r1, cols + r0 * k); });
    Gemm(rows, npix, s.o, k, cols, k, bp->data(), y, s.o, e);
    return;
  }
  ParallelRows(npix, kMC, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> cols;
    cols.resize(static_cast<size_t>(std::min(kMC, r1 - r0) * k));
    for (int64_t t0 = r0; t0 < r1; t0 += kMC) {
      const int64_t t1 = std::min(r1, t0 + kMC);
      Im2col(s, x, t0, t1, cols.data());
      Multiply(rows, 0, t1 - t0, 0, Panels(s.o), s.o, k, cols.data(), k, bp->data(),
               y + t0 * s.o, s.o, e.Down(t0, s.o));
    }
  });
}

}  // namespace packed

// ---------------------------------------------------------------------------------------------
// Winograd F(m x m, 3 x 3) for 3x3, stride 1, dilation 1 (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2016). One output tile Y (m x m) of one channel pair is
//
//     Y = A^T [ (G g G^T) .* (B^T d B) ] A
//
// where d is the (m+2) x (m+2) input patch, g the 3x3 kernel and .* the elementwise product.
// Summed over input channels, each of the (m+2)^2 elementwise positions p becomes a GEMM:
//
//     M[p] (tiles x K) = V[p] (tiles x C) x U[p] (C x K),  V[p] = (B^T d B)[p], U[p] = (G g G^T)[p]
//
// So a call is three phases, each parallel on TVM's pool: the input transform (tiles in
// parallel), (m+2)^2 sgemms (positions in parallel), the output transform (tiles in parallel).
// The multiplications per output drop from 9*C to (m+2)^2/m^2 * C (F(2,3): 4C, F(4,3): 2.25C);
// the transforms cost O(C + K) per tile and the numerical error grows with m (F(4,3)'s matrices
// hold 1/24 .. 8).
//
// The transformed weights U ((m+2)^2 * C * K floats) are computed once per weight and kept in
// a cache (WeightCache below).

// F(2x2, 3x3): interpolation points 0, 1, -1 and infinity.
struct F2 {
  static constexpr int kM = 2, kAlpha = 4;
  static constexpr float kBT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr float kG[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};
  static constexpr float kAT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};

// F(4x4, 3x3): interpolation points 0, 1, -1, 2, -2 and infinity.
struct F4 {
  static constexpr int kM = 4, kAlpha = 6;
  static constexpr float kBT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0},
                                      {0, 4, -4, -1, 1, 0}, {0, -2, -1, 2, 1, 0},
                                      {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
  static constexpr float kG[6][3] = {{1.0f / 4, 0, 0},
                                     {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                     {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                     {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                     {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                     {0, 0, 1}};
  static constexpr float kAT[4][6] = {{1, 1, 1, 1, 1, 0},
                                      {0, 1, -1, 2, -2, 0},
                                      {0, 1, 1, 4, 4, 0},
                                      {0, 1, -1, 8, -8, 1}};
};

// The transforms work on small tiles of channel vectors: Vec is kLanes consecutive channels
// (the contiguous NHWC axis; GCC's vector extension, so every operation is a vector operation on
// any x86-64, 2 SSE or 1 AVX register), a tile Vec[rows][cols]. With the matrices constexpr and
// the loops unrolled, the zero coefficients cost nothing and the ones are plain adds.

constexpr int kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

TUNEHUB_INLINE Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

TUNEHUB_INLINE Vec Load(const float* p, int64_t count) {
  Vec v = {};
  if (count == kLanes) return Load(p);
  std::memcpy(&v, p, static_cast<size_t>(count) * sizeof(float));
  return v;
}


TUNEHUB_INLINE void Store(float* p, const Vec& v) { std::memcpy(p, &v, sizeof(v)); }

TUNEHUB_INLINE void Store(float* p, const Vec& v, int64_t count) {
  if (count == kLanes)
    Store(p, v);
  else
    std::memcpy(p, &v, static_cast<size_t>(count) * sizeof(float));
}

// out[s][q] = sum_r mx[s][r] * in[r][q]    (in: Vec[R][Q], out: Vec[S][Q]): mx x in
template <int S, int R, int Q>
TUNEHUB_INLINE void MulRows(const float (&mx)[S][R], const Vec* in, Vec* out) {
#pragma GCC unroll 8
  for (int si = 0; si < S; ++si)
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) {
      Vec acc = {};
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        if (mx[si][r] != 0.0f) acc += mx[si][r] * in[r * Q + q];
      out[si * Q + q] = acc;
    }
}

// out[q][s] = sum_r mx[s][r] * in[q][r]    (in: Vec[Q][R], out: Vec[Q][S]): in x mx^T
template <int S, int R, int Q>
TUNEHUB_INLINE void MulCols(const float (&mx)[S][R], const Vec* in, Vec* out) {
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 8
    for (int si = 0; si < S; ++si) {
      Vec acc = {};
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        if (mx[si][r] != 0.0f) acc += mx[si][r] * in[q * R + r];
      out[q * S + si] = acc;
    }
}

struct Tiling {
  int64_t rows, cols, count;  // tiles per image column / row; all tiles of all images
};

template <typename F>
Tiling TilesOf(const ConvShape& s) {
  const int64_t rows = (s.oh + F::kM - 1) / F::kM, cols = (s.ow + F::kM - 1) / F::kM;
  return {rows, cols, s.n * rows * cols};
}

// U[p][c][k] = (G g G^T)[p] for g = w[:, :, c, k], input channels [c0, c1).
template <typename F>
TUNEHUB_SIMD_CLONES void WeightTransform(const ConvShape& s, const float* w, int64_t c0,
                                         int64_t c1, float* u) {
  constexpr int A = F::kAlpha;
  Vec g[3 * 3], tmp[A * 3], z[A * A];
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t k0 = 0; k0 < s.o; k0 += kLanes) {
      const int64_t kb = std::min<int64_t>(kLanes, s.o - k0);
      for (int i = 0; i < 9; ++i) g[i] = Load(w + (i * s.c + c) * s.o + k0, kb);
      MulRows<A, 3, 3>(F::kG, g, tmp);  // G g
      MulCols<A, 3, A>(F::kG, tmp, z);  // (G g) G^T
      for (int p = 0; p < A * A; ++p) Store(u + (p * s.c + c) * s.o + k0, z[p], kb);
    }
}

// V[t - first][p][c] = (B^T d B)[p] for the input patch d of tiles [t0, t1).
template <typename F>
TUNEHUB_SIMD_CLONES void InputTransform(const ConvShape& s, const Tiling& tiling, const float* x,
                                        int64_t t0, int64_t t1, int64_t first, float* v) {
  constexpr int A = F::kAlpha;
  Vec d[A * A], tmp[A * A], z[A * A];
  const int64_t per_image = tiling.rows * tiling.cols;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t image = t / per_image, ty = (t % per_image) / tiling.cols,
                  tx = t % tiling.cols;
    const int64_t iy0 = ty * F::kM - s.pt, ix0 = tx * F::kM - s.pl;
    const float* src = x + image * s.h * s.w * s.c;
    // the patch's rows and columns inside the image (all of them except at the edges)
    const int i0 = static_cast<int>(std::max<int64_t>(0, -iy0));
    const int i1 = static_cast<int>(std::min<int64_t>(A, s.h - iy0));
    const int j0 = static_cast<int>(std::max<int64_t>(0, -ix0));
    const int j1 = static_cast<int>(std::min<int64_t>(A, s.w - ix0));
    const bool inside = i0 == 0 && i1 == A && j0 == 0 && j1 == A;
    for (int64_t c0 = 0; c0 < s.c; c0 += kLanes) {
      const int64_t cb = std::min<int64_t>(kLanes, s.c - c0);
      const float* base = src + (iy0 * s.w + ix0) * s.c + c0;
      if (inside && cb == kLanes) {
#pragma GCC unroll 8
        for (int i = 0; i < A; ++i)
#pragma GCC unroll 8
          for (int j = 0; j < A; ++j) d[i * A + j] = Load(base + (i * s.w + j) * s.c);
      } else {
        for (int i = 0; i < A; ++i)
          for (int j = 0; j < A; ++j)
            d[i * A + j] = (i < i0 || i >= i1 || j < j0 || j >= j1)
                               ? Vec{}
                               : Load(base + (i * s.w + j) * s.c, cb);
      }
      MulRows<A, A, A>(F::kBT, d, tmp);  // B^T d
      MulCols<A, A, A>(F::kBT, tmp, z);  // (B^T d) B
      for (int p = 0; p < A * A; ++p) Store(v + ((t - first) * A * A + p) * s.c + c0, z[p], cb);
    }
  }
}

// y[tile t] = A^T M[t - first] A for tiles [t0, t1), clipped at the output's bottom and right
// edges.
template <typename F>
TUNEHUB_SIMD_CLONES void OutputTransform(const ConvShape& s, const Tiling& tiling, const float* mm,
                                         int64_t t0, int64_t t1, int64_t first, float* y,
                                         const Epilogue& ep) {
  constexpr int A = F::kAlpha, M = F::kM;
  Vec e[A * A], tmp[M * A], z[M * M];
  const int64_t per_image = tiling.rows * tiling.cols;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t image = t / per_image, ty = (t % per_image) / tiling.cols,
                  tx = t % tiling.cols;
    const int64_t oy0 = ty * M, ox0 = tx * M;
    const int rows = static_cast<int>(std::min<int64_t>(M, s.oh - oy0));
    const int cols = static_cast<int>(std::min<int64_t>(M, s.ow - ox0));
    float* dst = y + (image * s.oh * s.ow + oy0 * s.ow + ox0) * s.o;
    for (int64_t k0 = 0; k0 < s.o; k0 += kLanes) {
      const int64_t kb = std::min<int64_t>(kLanes, s.o - k0);
      const float* in = mm + (t - first) * A * A * s.o + k0;
      if (kb == kLanes) {
#pragma GCC unroll 8
        for (int p = 0; p < A * A; ++p) e[p] = Load(in + p * s.o);
      } else {
        for (int p = 0; p < A * A; ++p) e[p] = Load(in + p * s.o, kb);
      }
      MulRows<M, A, A>(F::kAT, e, tmp);  // A^T M
      MulCols<M, A, M>(F::kAT, tmp, z);  // (A^T M) A
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) Store(dst + (i * s.ow + j) * s.o + k0, z[i * M + j], kb);
    }
    const int64_t pixel = image * s.oh * s.ow + oy0 * s.ow + ox0;
    for (int i = 0; i < rows; ++i)
      ApplyEpilogue(ep, y, s.o, pixel + i * s.ow, pixel + i * s.ow + cols, 0, s.o);
  }
}

template <typename F>
void ConvWinograd(const ConvShape& s, const float* x, const float* w, float* y,
                  const Epilogue& e) {
  constexpr int64_t P = F::kAlpha * F::kAlpha;
  const Tiling tiling = TilesOf<F>(s);
  // U[p] ([C x K] per position) as plain rows for sgemm, or, where the packed GEMM's
  // micro-kernel runs, packed into its panels (Up[p][panel][C][kNR]).
  const packed::RowsFn rows = packed::Rows();
  const int64_t panel_floats = packed::Panels(s.o) * s.c * packed::kNR;
  const auto transform = [&](float* out) {
    ParallelRows(s.c, 4, [&](int64_t c0, int64_t c1) { WeightTransform<F>(s, w, c0, c1, out); });
  };
  const WeightCache::Block u =
      rows == nullptr
          ? WeightCache::Get(F::kM == 4 ? WeightCache::kWinogradF4 : WeightCache::kWinogradF2, w,
                             9 * s.c * s.o, s.c, s.o, P * s.c * s.o, transform)
          : WeightCache::Get(
                F::kM == 4 ? WeightCache::kWinogradF4Packed : WeightCache::kWinogradF2Packed, w,
                9 * s.c * s.o, s.c, s.o, P * panel_floats, [&](float* out) {
                  std::vector<float> plain(static_cast<size_t>(P * s.c * s.o));
                  transform(plain.data());
                  ParallelRows(P, 1, [&](int64_t p0, int64_t p1) {
                    for (int64_t q = p0; q < p1; ++q)
                      packed::Pack(plain.data() + q * s.c * s.o, s.c, s.o, false,
                                   out + q * panel_floats);
                  });
                });
  // Tiles in chunks whose V and M take at most kChunkBytes (so that a large image needs no
  // large scratch, and V and M stay in the last-level cache), at least kMinChunk tiles (the
  // GEMMs' rows).
  constexpr int64_t kChunkBytes = int64_t{8} << 20, kMinChunk = 64;
  const int64_t chunk = std::min(
      tiling.count,
      std::max(kMinChunk, kChunkBytes / (P * (s.c + s.o) * static_cast<int64_t>(sizeof(float)))));
  float* v = Scratch(0, P * chunk * s.c);
  float* mm = Scratch(1, P * chunk * s.o);
  for (int64_t first = 0; first < tiling.count; first += chunk) {
    const int64_t count = std::min(chunk, tiling.count - first);
    ParallelRows(count, 4, [&](int64_t t0, int64_t t1) {
      InputTransform<F>(s, tiling, x, first + t0, first + t1, first, v);
    });
    // V[:, p] is [count x C] with rows P*C apart, M[:, p] [count x K] with rows P*K apart
    ParallelRows(P, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        if (rows != nullptr)
          packed::Multiply(rows, 0, count, 0, packed::Panels(s.o), s.o, s.c, v + p * s.c,
                           P * s.c, u->data() + p * panel_floats, mm + p * s.o, P * s.o);
        else
          Sgemm(kNoTrans, count, s.o, s.c, v + p * s.c, P * s.c, u->data() + p * s.c * s.o,
                s.o, mm + p * s.o, P * s.o);
      }
    });
    ParallelRows(count, 4, [&](int64_t t0, int64_t t1) {
      OutputTransform<F>(s, tiling, mm, first + t0, first + t1, first, y, e);
    });
  }
}
}  // namespace

#define TUNEHUB_EPILOGUE_ARGS \
  int32_t flags, const float *bias, const float *residual, float lo, float hi
#define TUNEHUB_EPILOGUE Epilogue::Of(flags, bias, residual, lo, hi)

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

// ---------------------------------------------------------------------------------------------
// Depthwise convolution, NHWC input, weight [KH, KW, 1, C] (groups = C, one filter a channel):
//   Y[b, oy, ox, c] = sum_{ky, kx} X[b, oy*sh - pt + ky*dh, ox*sw - pl + kx*dw, c] * W[ky, kx, c]
// with zeros outside the image. MobileNet-style networks have one after every expansion; there
// is no GEMM in it (each output reads 9 inputs and 9 weights once), so it is bound by memory and
// by the loads feeding its multiply-adds, and a library's version wins by one thing: vectors
// along the channels, which NHWC keeps contiguous. Each output pixel's channels are computed in
// blocks of U vectors of L floats (U independent accumulators in registers), taps clipped to
// the image once per row and pixel, the tail past the last whole vector in scalars. Output rows
// are split over TVM's thread pool. Compiled for AVX-512 (L = 16), AVX2 + FMA (8) and the
// baseline (4, SSE); TUNEHUB_PEERS_ISA caps the choice as for the packed GEMM.

namespace depthwise {

using RowsFn = void (*)(const ConvShape& s, const float* x, const float* w, float* y,
                        int64_t r0, int64_t r1, const Epilogue& e);

// [k0, k1): the taps k of one axis whose input index o*stride - pad + k*dilation is in [0, size).
TUNEHUB_INLINE void Taps(int64_t o, int64_t stride, int64_t pad, int64_t dilation, int64_t taps,
                         int64_t size, int64_t* k0, int64_t* k1) {
  const int64_t first = o * stride - pad;
  int64_t lo = 0, hi = taps;
  while (lo < hi && first + lo * dilation < 0) ++lo;
  while (hi > lo && first + (hi - 1) * dilation >= size) --hi;
  *k0 = lo;
  *k1 = hi;
}

// out[ch, ch + L) = the accumulated channels [ch, ch + L) of one output pixel with the epilogue
// applied; ``residual``: that pixel's row of the residual, or nullptr.
template <int L>
TUNEHUB_INLINE void Finish(float* out, const float* accumulated, const Epilogue& e,
                           const float* residual, int64_t ch) {
  typedef float V __attribute__((vector_size(4 * L)));
  V acc;
  std::memcpy(&acc, accumulated, sizeof acc);
  if (e.bias != nullptr) {
    V b;
    std::memcpy(&b, e.bias + ch, sizeof b);
    acc += b;
  }
  if (residual != nullptr) {
    V q;
    std::memcpy(&q, residual + ch, sizeof q);
    acc += q;
  }
  const V lo = V{} + e.lo, hi = V{} + e.hi;
  acc = acc < lo ? lo : acc;
  acc = acc > hi ? hi : acc;
  std::memcpy(out + ch, &acc, sizeof acc);
}

// Output rows [r0, r1) (row r: image r / oh, output row r % oh), the epilogue applied to the
// accumulators before they are stored.
template <int L>
TUNEHUB_INLINE void RowsOf(const ConvShape& s, const float* x, const float* w, float* y,
                           int64_t r0, int64_t r1, const Epilogue& e) {
  typedef float V __attribute__((vector_size(4 * L)));
  constexpr int U = 4;
  const int64_t c = s.c;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t b = r / s.oh, oy = r % s.oh;
    const float* image = x + b * s.h * s.w * c;
    int64_t ky0, ky1;
    Taps(oy, s.sh, s.pt, s.dh, s.kh, s.h, &ky0, &ky1);
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      int64_t kx0, kx1;
      Taps(ox, s.sw, s.pl, s.dw, s.kw, s.w, &kx0, &kx1);
      const int64_t pixel = r * s.ow + ox;
      float* out = y + pixel * c;
      const float* residual = e.residual ? e.residual + pixel * c : nullptr;
      // the input pixel of tap (ky, kx) and the weights of that tap
      auto in = [&](int64_t ky, int64_t kx) {
        return image + ((oy * s.sh - s.pt + ky * s.dh) * s.w + ox * s.sw - s.pl + kx * s.dw) * c;
      };
      auto taps = [&](int64_t ky, int64_t kx) { return w + (ky * s.kw + kx) * c; };
      int64_t c0 = 0;
      for (; c0 + U * L <= c; c0 += U * L) {
        V acc[U] = {};
        for (int64_t ky = ky0; ky < ky1; ++ky)
          for (int64_t kx = kx0; kx < kx1; ++kx) {
            const float *xp = in(ky, kx) + c0, *wp = taps(ky, kx) + c0;
#pragma GCC unroll 4
            for (int u = 0; u < U; ++u) {
              V xv, wv;
              std::memcpy(&xv, xp + u * L, sizeof xv);
              std::memcpy(&wv, wp + u * L, sizeof wv);
              acc[u] += xv * wv;
            }
          }
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u)
          Finish<L>(out, reinterpret_cast<const float*>(&acc[u]), e, residual, c0 + u * L);
      }
      for (; c0 + L <= c; c0 += L) {
        V acc = {};
        for (int64_t ky = ky0; ky < ky1; ++ky)
          for (int64_t kx = kx0; kx < kx1; ++kx) {
            V xv, wv;
            std::memcpy(&xv, in(ky, kx) + c0, sizeof xv);
            std::memcpy(&wv, taps(ky, kx) + c0, sizeof wv);
            acc += xv * wv;
          }
        Finish<L>(out, reinterpret_cast<const float*>(&acc), e, residual, c0);
      }
      const int64_t tail = c0;  // the channels past the last whole vector, in scalars
      for (; c0 < c; ++c0) {
        float acc = 0.0f;
        for (int64_t ky = ky0; ky < ky1; ++ky)
          for (int64_t kx = kx0; kx < kx1; ++kx) acc += in(ky, kx)[c0] * taps(ky, kx)[c0];
        out[c0] = acc;
      }
      if (tail < c) ApplyEpilogue(e, y, c, pixel, pixel + 1, tail, c);
    }
  }
}

void RowsBaseline(const ConvShape& s, const float* x, const float* w, float* y, int64_t r0,
                  int64_t r1, const Epilogue& e) {
  RowsOf<4>(s, x, w, y, r0, r1, e);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void Rows512(const ConvShape& s, const float* x,
                                                const float* w, float* y, int64_t r0,
                                                int64_t r1, const Epilogue& e) {
  RowsOf<16>(s, x, w, y, r0, r1, e);
}

__attribute__((target("avx2,fma"))) void Rows256(const ConvShape& s, const float* x,
                                                 const float* w, float* y, int64_t r0,
                                                 int64_t r1, const Epilogue& e) {
  RowsOf<8>(s, x, w, y, r0, r1, e);
}

// PeersIsa's build of the kernel.
RowsFn ChooseRows() { return ForPeersIsa<RowsFn>(Rows512, Rows256, RowsBaseline); }
#else
RowsFn ChooseRows() { return RowsBaseline; }
#endif

}  // namespace depthwise

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
