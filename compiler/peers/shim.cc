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
// All tensors are compact float32 on the CPU. Both return 0.
//
// Threads: the work is split into row blocks run on TVM's own thread pool
// (TVMBackendParallelLaunch), each calling single-threaded sgemm: the library uses exactly the
// threads TVM's kernels use, and OpenBLAS's own pool never competes with TVM's spinning workers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

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

extern "C" int tunehub_peer_gemm(const float* a, const float* b, float* c, int64_t batch,
                                 int64_t m, int64_t n, int64_t k, int32_t trans_b,
                                 int32_t b_batched) {
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
      });
    } else if (rows >= 16) {  // split rows
      ParallelRows(rows, 8, [&](int64_t r0, int64_t r1) {
        Sgemm(tb, r1 - r0, n, k, a + r0 * k, k, b, ldb, c + r0 * n, n);
      });
    } else {  // a GEMV-like product: split columns
      ParallelRows(n, 64, [&](int64_t c0, int64_t c1) {
        Sgemm(tb, rows, c1 - c0, k, a, k, trans_b ? b + c0 * k : b + c0, ldb, c + c0, n);
      });
    }
    return 0;
  }
  ParallelRows(batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i)
      Sgemm(tb, m, n, k, a + i * m * k, k, b + i * k * n, ldb, c + i * m * n, n);
  });
  return 0;
}

extern "C" int tunehub_peer_conv2d_nhwc(const float* x, const float* w, float* y, int64_t n,
                                        int64_t h, int64_t wd, int64_t ch, int64_t kh,
                                        int64_t kw, int64_t o, int64_t oh, int64_t ow,
                                        int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                                        int32_t dh, int32_t dw) {
  SingleThreadedBlas();
  const int64_t k = kh * kw * ch, pixels = oh * ow;
  if (kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0) {
    ParallelRows(n * pixels, 8, [&](int64_t r0, int64_t r1) {
      Sgemm(kNoTrans, r1 - r0, o, ch, x + r0 * ch, ch, w, o, y + r0 * o, o);
    });
    return 0;
  }
  // Rows of all images together (row r: image r / pixels, output pixel r % pixels), im2col'd
  // and multiplied kTileRows at a time so that the column block stays in cache.
  constexpr int64_t kTileRows = 256;
  ParallelRows(n * pixels, 8, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> cols;
    cols.resize(static_cast<size_t>(std::min(kTileRows, r1 - r0) * k));
    for (int64_t t0 = r0; t0 < r1; t0 += kTileRows) {
      const int64_t t1 = std::min(r1, t0 + kTileRows);
      for (int64_t r = t0; r < t1; ++r) {
        const int64_t image = r / pixels, py = (r % pixels) / ow, px = r % ow;
        const float* src = x + image * h * wd * ch;
        float* row = cols.data() + (r - t0) * k;
        for (int64_t ky = 0; ky < kh; ++ky) {
          const int64_t iy = py * sh - pt + ky * dh;
          for (int64_t kx = 0; kx < kw; ++kx) {
            const int64_t ix = px * sw - pl + kx * dw;
            float* dst = row + (ky * kw + kx) * ch;
            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) {
              std::fill(dst, dst + ch, 0.0f);
            } else if (ch < 16) {  // a few channels (an RGB stem): a call per pixel costs more
              const float* in = src + (iy * wd + ix) * ch;
              for (int64_t i = 0; i < ch; ++i) dst[i] = in[i];
            } else {
              std::memcpy(dst, src + (iy * wd + ix) * ch, ch * sizeof(float));
            }
          }
        }
      }
      Sgemm(kNoTrans, t1 - t0, o, k, cols.data(), k, w, o, y + t0 * o, o);
    }
  });
  return 0;
}
