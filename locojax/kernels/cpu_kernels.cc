// CPU kernels for the rollout decode loop, as XLA FFI handlers (built by cpu_kernels.py with
// g++ -O3 -march=native against jaxlib's FFI headers).
//
// "locojax_panel_matmul": y_MxN = x_MxK @ W_KxN, W stored as panels PxKx64 (panel p: columns
// [64p, 64p+64)), for decode-sized row counts. Each panel is one contiguous K x 64 block, so
// the weight is read front to back. The register tile fits the vector registers the code is
// compiled for: with AVX-512 (32 x 16 floats) a panel is multiplied by up to 6 rows at a time
// with 6 x 4 16-float accumulators (one 64-float row of the panel per k); with 8-float vectors
// (AVX2: 16 registers) by up to 6 rows and one 16-column quarter of the panel at a time, 6 x 2
// 8-float accumulators, 2 for the panel's row and 1 for the broadcast x (15 registers), the
// quarters one after another while the 64 KB panel stays in cache. Panels are handed out from
// an atomic counter to the calling thread and to `split - 1` tasks on XLA's intra-op thread
// pool; the call returns once every panel is written.
// "locojax_pack_panels": the panels of a KxN (or, transposed, NxK) matrix, shared out alike.
// "locojax_decode_attention": one decode step's masked softmax attention per (row, kv head),
// reading only the cache slots up to the row's last valid one.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 64;  // columns per panel: four 16-float vectors
typedef float Vec16 __attribute__((vector_size(64), aligned(4)));
typedef float Vec8 __attribute__((vector_size(32), aligned(4)));

#if defined(__AVX512F__)
// R rows of x (row stride k_dim) times one panel -> R x 64 block of y (row stride ldy).
template <int R>
inline void RowsTimesPanel(const float* x, int64_t k_dim, const float* panel, float* y,
                           int64_t ldy) {
  Vec16 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = Vec16{};
  for (int64_t k = 0; k < k_dim; ++k) {
    const Vec16* w = reinterpret_cast<const Vec16*>(panel + k * kPanel);
    const Vec16 w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * k_dim + k];
      acc[r][0] += xv * w0;
      acc[r][1] += xv * w1;
      acc[r][2] += xv * w2;
      acc[r][3] += xv * w3;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) *reinterpret_cast<Vec16*>(y + r * ldy + j * 16) = acc[r][j];
}
#else
// R rows of x times one 16-column quarter `q` of a panel -> R x 16 block of y.
template <int R>
inline void RowsTimesQuarter(const float* x, int64_t k_dim, const float* panel, int q,
                             float* y, int64_t ldy) {
  Vec8 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = Vec8{};
  const float* column = panel + q * 16;
  for (int64_t k = 0; k < k_dim; ++k) {
    const Vec8* w = reinterpret_cast<const Vec8*>(column + k * kPanel);
    const Vec8 w0 = w[0], w1 = w[1];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * k_dim + k];
      acc[r][0] += xv * w0;
      acc[r][1] += xv * w1;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2; ++j)
      *reinterpret_cast<Vec8*>(y + r * ldy + q * 16 + j * 8) = acc[r][j];
}

// R rows of x times one panel, a quarter at a time (the same contract as AVX-512's).
template <int R>
inline void RowsTimesPanel(const float* x, int64_t k_dim, const float* panel, float* y,
                           int64_t ldy) {
  for (int q = 0; q < 4; ++q) RowsTimesQuarter<R>(x, k_dim, panel, q, y, ldy);
}
#endif

void OnePanel(const float* x, int64_t m, int64_t k_dim, const float* panels, int64_t n,
              int64_t p, float* y) {
  const float* panel = panels + p * k_dim * kPanel;
  float* out = y + p * kPanel;
  int64_t r = 0;
  for (; r + 6 <= m; r += 6) RowsTimesPanel<6>(x + r * k_dim, k_dim, panel, out + r * n, n);
  for (; r + 4 <= m; r += 4) RowsTimesPanel<4>(x + r * k_dim, k_dim, panel, out + r * n, n);
  for (; r + 2 <= m; r += 2) RowsTimesPanel<2>(x + r * k_dim, k_dim, panel, out + r * n, n);
  for (; r < m; ++r) RowsTimesPanel<1>(x + r * k_dim, k_dim, panel, out + r * n, n);
}

struct Progress {
  std::atomic<int64_t> next{0};  // first item nobody has taken
  std::atomic<int64_t> done{0};  // items finished
};

// Runs fn(i) for i in [0, count): items are taken from a shared counter by the calling thread
// and by `split - 1` tasks on XLA's intra-op pool; returns once every item has finished.
template <typename Fn>
void ParallelFor(ffi::ThreadPool& pool, int64_t count, int64_t split, Fn fn) {
  if (split <= 1 || count < 2) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  // Shared so a pool task that starts after the call returned still reads valid counters.
  auto progress = std::make_shared<Progress>();
  auto work = [=]() {
    for (int64_t i; (i = progress->next.fetch_add(1)) < count;) {
      fn(i);
      progress->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < split; ++t) pool.Schedule([work]() { work(); });
  work();
  while (progress->done.load(std::memory_order_acquire) < count) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
}

ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> y, int64_t split) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != kPanel ||
      wd[1] != xd[1] || yd[0] != xd[0] || yd[1] != wd[0] * kPanel) {
    return ffi::Error::InvalidArgument(
        "locojax_cpu_kernels: expected x MxK, panels PxKx64 and y Mx(64P)");
  }
  const int64_t m = xd[0], k_dim = xd[1], n = wd[0] * kPanel;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  ParallelFor(pool, wd[0], split, [=](int64_t p) { OnePanel(xp, m, k_dim, wp, n, p, yp); });
  return ffi::Error::Success();
}

// panels[p, k, j] = W[k, 64p + j] (W KxN), or W[64p + j, k] with `transposed` (W NxK).
ffi::Error PackPanels(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w,
                      ffi::ResultBuffer<ffi::F32> out, bool transposed, int64_t split) {
  const auto wd = w.dimensions();
  const auto od = out->dimensions();
  const int64_t k_dim = transposed ? wd[1] : wd[0];
  const int64_t n = transposed ? wd[0] : wd[1];
  if (wd.size() != 2 || od.size() != 3 || od[2] != kPanel || od[1] != k_dim ||
      od[0] * kPanel != n) {
    return ffi::Error::InvalidArgument(
        "locojax_pack_panels: expected W KxN (NxK if transposed) and panels (N/64)xKx64");
  }
  const float* src = w.typed_data();
  float* dst = out->typed_data();
  ParallelFor(pool, od[0], split, [=](int64_t p) {
    float* panel = dst + p * k_dim * kPanel;
    if (!transposed) {
      for (int64_t k = 0; k < k_dim; ++k)
        std::memcpy(panel + k * kPanel, src + k * n + p * kPanel, kPanel * sizeof(float));
      return;
    }
    // 64 contiguous rows of W -> the panel's 64 columns; the 64 KB panel stays in cache.
    const float* rows = src + p * kPanel * k_dim;
    for (int64_t j = 0; j < kPanel; ++j)
      for (int64_t k = 0; k < k_dim; ++k) panel[k * kPanel + j] = rows[j * k_dim + k];
  });
  return ffi::Error::Success();
}

typedef int32_t IVec16 __attribute__((vector_size(64)));

// e^x for 16 floats (Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial in r,
// times 2^n built in the exponent bits); within ~2 ulp of expf for x in [-87, 88].
inline Vec16 Exp16(Vec16 x) {
  const Vec16 lo = Vec16{} - 87.0f, hi = Vec16{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Vec16 n = (x * 1.44269504088896341f + magic) - magic;
  Vec16 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const IVec16 bits = (__builtin_convertvector(n, IVec16) + 127) << 23;
  Vec16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

constexpr int64_t kMaxGroup = 16;  // query heads per kv head handled in one pass

// out[g][0:W] = sum_{i < count} coef[g * coef_stride + i] * src[i * src_stride + (0:W)] for
// g < gn, with W = 16 (one vector) or 1: each src element is read once for all gn heads.
// Scores are this with coef = q, src = the keys' columns; outputs with coef = the softmax
// weights, src = the values' rows.
template <int W>
inline void GroupedProducts(const float* coef, int64_t coef_stride, const float* src,
                            int64_t src_stride, int64_t count, int64_t gn, float* out,
                            int64_t out_stride) {
  Vec16 acc[kMaxGroup];
  for (int64_t g = 0; g < gn; ++g) acc[g] = Vec16{};
  for (int64_t i = 0; i < count; ++i) {
    Vec16 x{};
    std::memcpy(&x, src + i * src_stride, W * sizeof(float));
    for (int64_t g = 0; g < gn; ++g) acc[g] += coef[g * coef_stride + i] * x;
  }
  for (int64_t g = 0; g < gn; ++g) std::memcpy(out + g * out_stride, &acc[g], W * sizeof(float));
}

// Columns [0, width) of out_g = sum_i coef[g, i] src[i, :] for every head, in passes of up to
// kMaxGroup heads: whole vectors, then single columns.
void AllProducts(const float* coef, int64_t coef_stride, const float* src, int64_t src_stride,
                 int64_t count, int64_t g_dim, int64_t width, float* out, int64_t out_stride) {
  for (int64_t g0 = 0; g0 < g_dim; g0 += kMaxGroup) {
    const int64_t gn = g_dim - g0 < kMaxGroup ? g_dim - g0 : kMaxGroup;
    const float* c = coef + g0 * coef_stride;
    float* o = out + g0 * out_stride;
    int64_t col = 0;
    for (; col + 16 <= width; col += 16)
      GroupedProducts<16>(c, coef_stride, src + col, src_stride, count, gn, o + col, out_stride);
    for (; col < width; ++col)
      GroupedProducts<1>(c, coef_stride, src + col, src_stride, count, gn, o + col, out_stride);
  }
}

// One (row, kv head): softmax(scale * q K^T over valid slots) V for its G query heads.
// Reads only slots [0, n), n = 1 + the last valid slot of the row, each key and value once
// for up to kMaxGroup query heads.
void AttendOne(const float* q, const float* keys, const float* values, const bool* valid,
               int64_t g_dim, int64_t hd, int64_t s_dim, float scale, float* out,
               std::vector<float>& scratch) {
  int64_t n = s_dim;
  while (n > 0 && !valid[n - 1]) --n;
  const bool none_valid = n == 0;
  if (none_valid) n = s_dim;  // as the masked softmax: every slot weighs the same
  const int64_t n16 = (n + 15) / 16 * 16;  // scores padded to whole vectors
  scratch.assign(g_dim * n16 + g_dim, 0.0f);
  // Scores GxN: the keys' column j (stride S) against each head's q; whole vectors up to n16
  // where the rows have those slots (scores past n are overwritten below).
  AllProducts(q, hd, keys, s_dim, hd, g_dim, n16 <= s_dim ? n16 : n, scratch.data(), n16);
  // Softmax weights in place; each head's total after all the scores.
  float* totals = scratch.data() + g_dim * n16;
  for (int64_t g = 0; g < g_dim; ++g) {
    float* sc = scratch.data() + g * n16;
    float m = -3.0e38f;
    int64_t j = 0;
    for (; j < n; ++j) {
      const bool use = none_valid || valid[j];
      sc[j] = use ? sc[j] * scale : -3.0e38f;
      m = use && sc[j] > m ? sc[j] : m;
    }
    if (none_valid) m = 0.0f;
    for (j = n; j < n16; ++j) sc[j] = -3.0e38f;
    float sum = 0.0f;
    for (j = 0; j < n16; j += 16) {
      Vec16 v;
      std::memcpy(&v, sc + j, sizeof(v));
      v = none_valid ? Vec16{} + 1.0f : Exp16(v - m);
      for (int e = 0; e < 16; ++e) {
        const float p = (j + e < n && (none_valid || valid[j + e])) ? v[e] : 0.0f;
        sc[j + e] = p;
        sum += p;
      }
    }
    totals[g] = sum;
  }
  // Unnormalised outputs Gxhd: the weights against the values' rows, then / total.
  AllProducts(scratch.data(), n16, values, hd, n, g_dim, hd, out, hd);
  for (int64_t g = 0; g < g_dim; ++g)
    for (int64_t c = 0; c < hd; ++c) out[g * hd + c] /= totals[g];
}

// One decode step of attention: q BxKxGxhd, keys BxKxhdxS, values BxKxSxhd, valid BxS.
ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                           ffi::Buffer<ffi::F32> keys, ffi::Buffer<ffi::F32> values,
                           ffi::Buffer<ffi::PRED> valid, ffi::ResultBuffer<ffi::F32> out,
                           float scale, int64_t split) {
  const auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions();
  const auto md = valid.dimensions(), od = out->dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 2 ||
      od.size() != 4 || kd[0] != qd[0] || kd[1] != qd[1] || kd[2] != qd[3] ||
      vd[0] != qd[0] || vd[1] != qd[1] || vd[2] != kd[3] || vd[3] != qd[3] ||
      md[0] != qd[0] || md[1] != kd[3] || od[0] != qd[0] || od[1] != qd[1] ||
      od[2] != qd[2] || od[3] != qd[3]) {
    return ffi::Error::InvalidArgument(
        "locojax_decode_attention: expected q BxKxGxhd, keys BxKxhdxS, values BxKxSxhd, "
        "valid BxS and out BxKxGxhd");
  }
  const int64_t b_dim = qd[0], k_dim = qd[1], g_dim = qd[2], hd = qd[3], s_dim = kd[3];
  const float* qp = q.typed_data();
  const float* kp = keys.typed_data();
  const float* vp = values.typed_data();
  const bool* mp = valid.typed_data();
  float* op = out->typed_data();
  ParallelFor(pool, b_dim * k_dim, split, [=](int64_t i) {
    thread_local std::vector<float> scratch;
    const int64_t b = i / k_dim;
    AttendOne(qp + i * g_dim * hd, kp + i * hd * s_dim, vp + i * s_dim * hd, mp + b * s_dim,
              g_dim, hd, s_dim, scale, op + i * g_dim * hd, scratch);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LocojaxDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("split"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LocojaxPackPanels, PackPanels,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transposed")
                                  .Attr<int64_t>("split"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LocojaxPanelMatmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("split"));
