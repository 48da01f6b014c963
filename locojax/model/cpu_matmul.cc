// y_MxN = x_MxK @ W_KxN on the CPU, W stored as panels PxKx64 (panel p: columns [64p, 64p+64)).
//
// An XLA FFI handler (target "locojax_panel_matmul") for decode-sized row counts. Each panel is
// one contiguous K x 64 block, so the weight is read front to back; a panel is multiplied by
// up to 6 rows at a time with 6 x 4 vector accumulators (one 64-float row of the panel per k).
// Panels are handed out from an atomic counter to the calling thread and to `split - 1` tasks
// on XLA's intra-op thread pool; the call returns once every panel is written. A second
// handler ("locojax_pack_panels") makes the panels from a KxN or NxK matrix the same way.
// Built by locojax/model/cpu_matmul.py (g++ -O3 -march=native against jaxlib's FFI headers).

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 64;  // columns per panel: four 16-float vectors
typedef float Vec16 __attribute__((vector_size(64), aligned(4)));

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
        "locojax_panel_matmul: expected x MxK, panels PxKx64 and y Mx(64P)");
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

}  // namespace

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
