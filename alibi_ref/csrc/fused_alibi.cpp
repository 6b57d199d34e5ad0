// ALiBi attention on the CPU with the bias computed where the scores are: alibi_ref/fused.py says why and how.
//
// Flash attention (Dao et al., 2022) in blocks of queries i and keys j, per batch row b and head h:
//   s_ij = scale q_i . k_j - m_h |p_i - p_j|,   p_i = i + (k_len - q_len), p_j = j
//   o_i  = sum_j softmax_j(s_ij) v_j            (causal: over p_j <= p_i only)
// The scores of a block come from one BLAS product (bfloat16: oneDNN's brgemm, see Packed, or where that takes
// none, float32's on blocks widened to it, see Widened); scale and bias are applied in the pass that takes the
// row's maximum, so no bias is ever read from memory. The backward pass (float32, float64) recomputes each
// block's weights from the forward's log-sum-exp and gives dq, dk, dv and each head's slope gradient.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*);
}

namespace {

// BLAS is column-major: a row-major (r x c) matrix is its column-major (c x r) transpose, so each
// row-major product below is the column-major product of the transposes, operands swapped.
inline void blas(const char* ta, const char* tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void blas(const char* ta, const char* tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  dgemm_(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

// row-major C (m x n) = alpha A B^T + beta C, A (m x k), B (n x k)
template <typename T, typename A>
void times_transposed(int m, int n, int k, A alpha, const T* a, int lda, const T* b, int ldb, A beta, A* c,
                      int ldc) {
  blas("T", "N", n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}
// row-major C (m x n) = alpha A B + beta C, A (m x k), B (k x n)
template <typename T, typename A>
void times(int m, int n, int k, A alpha, const T* a, int lda, const T* b, int ldb, A beta, A* c, int ldc) {
  blas("N", "N", n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}
// row-major C (m x n) = alpha A^T B + beta C, A (k x m), B (k x n)
template <typename T, typename A>
void transposed_times(int m, int n, int k, A alpha, const T* a, int lda, const T* b, int ldb, A beta, A* c,
                      int ldc) {
  blas("N", "T", n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

namespace cephes {  // expf's constants, shared by the scalar and the vector form
constexpr float LOWEST = -87.0f, LOG2E = 1.44269504088896341f, LN2_HIGH = 0.693359375f, LN2_LOW = -2.12194440e-4f;
constexpr float POLY[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                          1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace cephes

// e^x for x <= 0, 0 below float's smallest normal number (a weight that small is below any row's rounding,
// and a subnormal one would slow the products that read it), NaN kept. Cephes' expf: x = n ln 2 + f with
// |f| <= ln 2 / 2, e^f by its degree-7 polynomial, 2^n by the exponent bits; written so the loop vectorises.
inline float exp_weight(float x) {
  using namespace cephes;
  const float clamped = x < LOWEST ? LOWEST : x;
  const float n = std::nearbyint(clamped * LOG2E);
  const float f = clamped - n * LN2_HIGH - n * LN2_LOW;
  float p = POLY[0];
  for (int i = 1; i < 6; ++i) p = p * f + POLY[i];
  p = p * f * f + f + 1.0f;
  const int bits = (static_cast<int>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const float e = p * two_n;
  return x != x ? x : (x < LOWEST ? 0.0f : e);
}
inline double exp_weight(double x) { return x < -708.0 ? 0.0 : std::exp(x); }

// The two passes over a row of scores, columns [lo, hi): first = p_j - p_i at column 0.
// add_bias: s_c = scale s_c - m |first + c| (s_c = q_i . k_j), returns the largest (a NaN score is passed
// over, and stays in the row)
template <typename T>
T add_bias(T* row, int64_t lo, int64_t hi, T scale, T m, T first) {
  T largest = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : largest)
  for (int64_t c = lo; c < hi; ++c) {
    const T x = scale * row[c] - m * std::fabs(first + static_cast<T>(c));  // the bias, -m |p_i - p_j|
    row[c] = x;
    largest = x > largest ? x : largest;  // not std::max, which kept gcc from vectorising the loop
  }
  return largest;
}
// exponentiate: w_c = e^(s_c - max), returns their sum. w is the row itself, or for 16-bit inputs the
// weights rounded to q's dtype for the product with v (the sum is of the weights before rounding, as torch's).
template <typename A, typename W>
A exponentiate(const A* row, W* w, int64_t lo, int64_t hi, A max) {
  A sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = lo; c < hi; ++c) {
    const A e = exp_weight(row[c] - max);
    w[c] = static_cast<W>(e);
    sum += e;
  }
  return sum;
}

#ifdef __AVX512F__
// float32 in 512-bit vectors, written out: gcc's loops above end each row in 16 serial additions
// exp_weight(float), 16 at a time. FIRST > 0 drops the polynomial's first terms, for weights rounded to bfloat16:
// FIRST = 2 is degree 5, within 3.3e-6 of e^x (relative; 1.1e-9 with all terms), under a thousandth of
// bfloat16's rounding.
template <int FIRST = 0>
inline __m512 exp_weight(__m512 x) {
  using namespace cephes;
  const __m512 lowest = _mm512_set1_ps(LOWEST);
  const __m512 clamped = _mm512_max_ps(lowest, x);  // max_ps gives its second operand, x, where x is NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LOW), _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HIGH), clamped));
  __m512 p = _mm512_set1_ps(POLY[FIRST]);
  for (int i = FIRST + 1; i < 6; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(POLY[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, f), f, f), _mm512_set1_ps(1.0f));
  const __m512 e = _mm512_scalef_ps(p, n);  // p 2^n, as exact as the scalar form's exponent bits
  return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ), _mm512_setzero_ps());  // NaN: not below
}
// the columns c .. c + 15 that are below hi
inline __mmask16 below(int64_t c, int64_t hi) { return hi - c >= 16 ? 0xFFFF : (1u << (hi - c)) - 1; }

template <>
float add_bias(float* row, int64_t lo, int64_t hi, float scale, float m, float first) {
  const __m512 factor = _mm512_set1_ps(scale), slope = _mm512_set1_ps(m), step = _mm512_set1_ps(16.0f);
  __m512 distance = _mm512_add_ps(_mm512_set1_ps(first + static_cast<float>(lo)),
                                  _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512 largest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = lo; c < hi; c += 16) {
    const __mmask16 k = below(c, hi);
    const __m512 score = _mm512_mul_ps(factor, _mm512_maskz_loadu_ps(k, row + c));
    const __m512 x = _mm512_fnmadd_ps(slope, _mm512_abs_ps(distance), score);
    _mm512_mask_storeu_ps(row + c, k, x);
    largest = _mm512_mask_max_ps(largest, k, x, largest);  // max_ps gives its second operand where x is NaN
    distance = _mm512_add_ps(distance, step);
  }
  return _mm512_reduce_max_ps(largest);
}
inline void store(float* to, __mmask16 k, __m512 w) { _mm512_mask_storeu_ps(to, k, w); }
#ifdef __AVX512BF16__
inline void store(at::BFloat16* to, __mmask16 k, __m512 w) {  // rounded to nearest even, as at::BFloat16 rounds
  _mm256_mask_storeu_epi16(to, k, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(w)));
}
#endif
template <typename W>
float exponentiate_vectors(const float* row, W* to, int64_t lo, int64_t hi, float max) {
  const __m512 shift = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = lo; c < hi; c += 16) {
    const __mmask16 k = below(c, hi);
    constexpr int first_term = std::is_same_v<W, float> ? 0 : 2;
    const __m512 w = exp_weight<first_term>(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + c), shift));
    store(to + c, k, w);
    sum = _mm512_mask_add_ps(sum, k, sum, w);
  }
  return _mm512_reduce_add_ps(sum);
}
inline float exponentiate(const float* row, float* w, int64_t lo, int64_t hi, float max) {
  return exponentiate_vectors(row, w, lo, hi, max);
}
#ifdef __AVX512BF16__
inline float exponentiate(const float* row, at::BFloat16* w, int64_t lo, int64_t hi, float max) {
  return exponentiate_vectors(row, w, lo, hi, max);
}
#endif
#elif defined(__AVX2__) && defined(__FMA__)
// float32 in 256-bit vectors, for CPUs without AVX-512 (an AMD EPYC, measured): gcc's loops above ran the
// forward at 1.3-2.0x plain SDPA's time there (symmetric; docs/performance.md, "AVX2 without AVX-512"). The same
// exp_weight's steps, 8 at a time (fused multiply-adds: within about an ulp of the scalar form, not bit for bit; the
// outputs moved by at most 1.4e-6 at N = 256-1024); the columns past the last 8 scalar.
inline __m256 exp_weight(__m256 x) {
  using namespace cephes;
  const __m256 lowest = _mm256_set1_ps(LOWEST);
  const __m256 clamped = _mm256_max_ps(lowest, x);  // max_ps gives its second operand, x, where x is NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LOW), _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HIGH), clamped));
  __m256 p = _mm256_set1_ps(POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(POLY[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, f), f, f), _mm256_set1_ps(1.0f));
  // 2^n from the exponent bits: clamped >= LOWEST keeps n >= -126, a normal number
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, lowest, _CMP_LT_OQ), _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
  return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN kept
}
inline float largest_of(__m256 x) {
  const __m128 half = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 quarter = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}
inline float sum_of(__m256 x) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}

template <>
float add_bias(float* row, int64_t lo, int64_t hi, float scale, float m, float first) {
  const __m256 factor = _mm256_set1_ps(scale), slope = _mm256_set1_ps(m), step = _mm256_set1_ps(8.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 distance = _mm256_add_ps(_mm256_set1_ps(first + static_cast<float>(lo)), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 largest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c = lo;
  for (; c + 8 <= hi; c += 8) {
    const __m256 score = _mm256_mul_ps(factor, _mm256_loadu_ps(row + c));
    const __m256 x = _mm256_fnmadd_ps(slope, _mm256_andnot_ps(sign, distance), score);
    _mm256_storeu_ps(row + c, x);
    largest = _mm256_max_ps(x, largest);  // max_ps gives its second operand where x is NaN
    distance = _mm256_add_ps(distance, step);
  }
  float most = largest_of(largest);
  for (; c < hi; ++c) {
    const float x = scale * row[c] - m * std::fabs(first + static_cast<float>(c));
    row[c] = x;
    most = x > most ? x : most;
  }
  return most;
}
inline float exponentiate(const float* row, float* w, int64_t lo, int64_t hi, float max) {
  const __m256 shift = _mm256_set1_ps(max);
  __m256 sums = _mm256_setzero_ps();
  int64_t c = lo;
  for (; c + 8 <= hi; c += 8) {
    const __m256 e = exp_weight(_mm256_sub_ps(_mm256_loadu_ps(row + c), shift));
    _mm256_storeu_ps(w + c, e);
    sums = _mm256_add_ps(sums, e);
  }
  float sum = sum_of(sums);
  for (; c < hi; ++c) {
    const float e = exp_weight(row[c] - max);
    w[c] = e;
    sum += e;
  }
  return sum;
}
#endif

constexpr int64_t Q_BLOCK = 128, K_BLOCK = 512;
// the stride between rows of a block's scores and weights, forward and backward: 32 numbers past the block, so
// that successive rows do not start a power of two apart and share the L1 cache's sets, which cost the products
// time (docs/performance.md, "bfloat16, forward"; the backward's, float32: 0.94-0.99x the time with rows K_BLOCK
// apart at N = 256-4096, three interleaved runs on an AMD EPYC); rows still start on a 64-byte line in float32
// and bfloat16
constexpr int64_t ROW = K_BLOCK + 32;

// A thread's working array, left uninitialised: every element is written before it is read, and a
// std::vector would zero it (256 KiB for a block of scores) at every call
template <typename T>
struct Scratch {
  std::unique_ptr<T[]> memory;
  explicit Scratch(int64_t n) : memory(new T[n]) {}
  T* data() const { return memory.get(); }
  T& operator[](int64_t i) const { return memory[i]; }
};

// The thread's own buffers of products that need none (Products::Local, made from the head size d)
struct NoBuffers {
  explicit NoBuffers(int64_t) {}
};

// Runs work(task, buffers) for task = 0 .. n_tasks - 1 on torch's threads, each thread taking the next task
// when it is done with one: tasks differ in cost (a causal block's keys grow with its queries, a head's window
// or reach narrows it), and a static split gave one thread the costly half. Each thread makes its buffers once.
// done() runs on each thread at its end.
template <typename Make, typename Work, typename Done = void (*)()>
void each_task(int64_t n_tasks, Make make_buffers, Work work, Done done = [] {}) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n_tasks), 1, [&](int64_t, int64_t) {
    auto buffers = make_buffers();
    for (int64_t task = next++; task < n_tasks; task = next++) work(task, buffers);
    done();
  });
}

struct Shape {
  int64_t batch, heads, groups, q_len, k_len, d, offset;  // offset: the position of query 0, k_len - q_len
};

// The keys a head's queries see: p_i - left <= p_j <= p_i + right (a sliding window, or each head's reach:
// alibi_ref.reach; causal is right = 0; no limit is k_len).
struct Seen {
  int64_t left, right;
  // keys [first, last) that some query of block [i0, i0 + rows) sees
  int64_t first(const Shape& sh, int64_t i0) const { return std::max<int64_t>(0, i0 + sh.offset - left); }
  int64_t last(const Shape& sh, int64_t i0, int64_t rows) const {
    return std::min(sh.k_len, i0 + rows - 1 + sh.offset + right + 1);
  }
  // the columns [lo, hi) of block [j0, j0 + cols) that query i sees (lo >= hi: none)
  void columns(const Shape& sh, int64_t i, int64_t j0, int64_t cols, int64_t& lo, int64_t& hi) const {
    lo = std::max<int64_t>(0, i + sh.offset - left - j0);
    hi = std::min(cols, i + sh.offset + right - j0 + 1);
    hi = std::max(lo, hi);
  }
};

// (B, H, n, d) with a unit stride along d; rows, heads and batch at any stride
template <typename T>
struct Rows {
  T* data;
  int64_t sb, sh, sn;
  Rows(const torch::Tensor& x)
      : data(x.data_ptr<T>()), sb(x.stride(0)), sh(x.stride(1)), sn(x.stride(2)) {}
  T* at(int64_t b, int64_t h, int64_t n) const { return data + b * sb + h * sh + n * sn; }
};

// The forward's two products for float32 and float64: BLAS, on k and v as they are.
template <typename T>
struct Plain {
  static constexpr int64_t ALIGN = 1;  // a block of keys may start anywhere
  static constexpr int64_t Q_ROWS = Q_BLOCK;
  using Weight = T;  // the weights' dtype in the product with v
  using Local = NoBuffers;
  void ready(int64_t, int64_t) const {}
  Rows<T> K, V;
  int64_t d;
  Plain(const torch::Tensor& k, const torch::Tensor& v, const Shape& sh) : K(k), V(v), d(sh.d) {}
  // s (rows, cols) = q k^T, keys [j0, j0 + cols)
  void scores(int64_t rows, int64_t cols, const T* q, int64_t ld_q, int64_t b, int64_t kv, int64_t j0, T* s,
              Local&) const {
    times_transposed(rows, cols, d, T(1), q, ld_q, K.at(b, kv, j0), K.sn, T(0), s, ROW);
  }
  // acc (rows, d) += p v
  void add_weighted(int64_t rows, int64_t cols, const T* p, int64_t b, int64_t kv, int64_t j0, T* acc,
                    Local&) const {
    times(rows, d, cols, T(1), p, ROW, V.at(b, kv, j0), V.sn, T(1), acc, d);
  }
  static void release() {}
};

// bfloat16 where brgemm takes none (AVX2; the kernel's takes_bfloat16()): each block of q, k and v widened to
// float32 in the thread's own buffers, then float32's products. Widening a block costs one pass over it per block
// of queries, under 2% of the products' work; converting q, k and v whole before the call cost more than the
// kernel itself at N = 64 (docs/performance.md, "AVX2 without AVX-512"), and took memory as large as them.
// The weights stay float32 for the product with v, as bfloat16 SDPA's do on such a CPU.
struct Widened {
  using BF = at::BFloat16;
  static constexpr int64_t ALIGN = 1;
  static constexpr int64_t Q_ROWS = Q_BLOCK;
  using Weight = float;
  struct Local {  // a block of queries, and one of keys or values, in float32
    Scratch<float> q, kv;
    explicit Local(int64_t d) : q(Q_BLOCK * d), kv(K_BLOCK * d) {}
  };
  void ready(int64_t, int64_t) const {}
  Rows<BF> K, V;
  int64_t d;
  Widened(const torch::Tensor& k, const torch::Tensor& v, const Shape& sh) : K(k), V(v), d(sh.d) {}
  // n rows of d numbers, ld apart, into to (n, d)
  void widen(const BF* from, int64_t ld, int64_t n, float* to) const {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < d; ++c) to[r * d + c] = static_cast<float>(from[r * ld + c]);
  }
  void scores(int64_t rows, int64_t cols, const BF* q, int64_t ld_q, int64_t b, int64_t kv, int64_t j0, float* s,
              Local& local) const {
    widen(q, ld_q, rows, local.q.data());
    widen(K.at(b, kv, j0), K.sn, cols, local.kv.data());
    times_transposed(rows, cols, d, 1.0f, local.q.data(), d, local.kv.data(), d, 0.0f, s, ROW);
  }
  void add_weighted(int64_t rows, int64_t cols, const float* p, int64_t b, int64_t kv, int64_t j0, float* acc,
                    Local& local) const {
    widen(V.at(b, kv, j0), V.sn, cols, local.kv.data());
    times(rows, d, cols, 1.0f, p, ROW, local.kv.data(), d, 1.0f, acc, d);
  }
  static void release() {}
};

// bfloat16's: oneDNN's brgemm (torch's cpublas, the route of its own flash kernel for 16-bit inputs), bf16 x
// bf16 into float32. brgemm reads its right operand (K, N) in VNNI pairs, (K / 2, N, 2): two rows interleaved,
// at most 64 columns at a time; k^T and v are packed so once per call.
namespace cpublas = at::native::cpublas;
constexpr int64_t VNNI_N = 64;
// queries a block: brgemm reads each packed chunk of k and v once a block, so more rows a block read them
// less often (as torch's flash kernel, which takes 256 from 768 queries; measured against 128 in
// docs/performance.md, "bfloat16, forward")
constexpr int64_t BF16_Q_ROWS = 256;

// whether brgemm runs here and its packed layout is the VNNI pairs this file writes (checked once, through
// cpublas::pack, which writes the layout brgemm reads, at each width this file packs)
bool takes_bfloat16() {
  static const bool takes = [] {
    if (!cpublas::could_pack(at::kBFloat16)) return false;
    constexpr int64_t K = 4;
    for (int64_t n : {16, 32, 48, 64}) {
      std::vector<at::BFloat16> plain(K * n), packed(K * n);
      for (int64_t i = 0; i < K * n; ++i) plain[i] = at::BFloat16(static_cast<float>(i));  // exact in bf16
      cpublas::pack(K, n, n, n, at::kBFloat16, at::kBFloat16, plain.data(), packed.data());
      for (int64_t r = 0; r < K; ++r)
        for (int64_t c = 0; c < n; ++c)
          if (static_cast<float>(packed[(r / 2) * 2 * n + 2 * c + r % 2]) != static_cast<float>(plain[r * n + c]))
            return false;
    }
    return true;
  }();
  return takes;
}

struct Packed {
  using BF = at::BFloat16;
  static constexpr int64_t ALIGN = VNNI_N;  // blocks of keys start at a packed chunk of 64
  static constexpr int64_t Q_ROWS = BF16_Q_ROWS;
  using Weight = BF;  // rounded to bfloat16, as torch's flash kernel does
  using Local = NoBuffers;
  const Rows<BF> K, V;
  int64_t d, k_len, kv_heads, padded;  // padded: k_len rounded up to 64
  torch::Tensor k_packed, v_packed;
  BF *kp, *vp;
  // per (b, KV head): 0 not packed, 1 being packed, 2 packed. The first task that reads a head packs it, in the
  // forward's own threads, rather than a parallel region of its own before them (the same within the noise).
  std::unique_ptr<std::atomic<int>[]> state;
  Packed(const torch::Tensor& k, const torch::Tensor& v, const Shape& sh)
      : K(k), V(v), d(sh.d), k_len(sh.k_len), kv_heads(sh.heads / sh.groups),
        padded((k_len + VNNI_N - 1) / VNNI_N * VNNI_N), state(new std::atomic<int>[sh.batch * kv_heads]) {
    k_packed = torch::empty({sh.batch, kv_heads, padded * d}, k.options());
    v_packed = torch::empty({sh.batch, kv_heads, padded * d}, v.options());
    kp = k_packed.data_ptr<BF>();
    vp = v_packed.data_ptr<BF>();
    for (int64_t i = 0; i < sh.batch * kv_heads; ++i) state[i].store(0, std::memory_order_relaxed);
  }
  // where (b, kv)'s packed k or v starts in k_packed or v_packed
  int64_t offset(int64_t b, int64_t kv) const { return (b * kv_heads + kv) * padded * d; }
  // k and v of (b, kv) packed, by this thread or (waited for) another
  void ready(int64_t b, int64_t kv) const {
    std::atomic<int>& head = state[b * kv_heads + kv];
    int expected = 0;
    if (head.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
      for (int64_t j0 = 0; j0 < k_len; j0 += VNNI_N) {
        const int64_t n = std::min(VNNI_N, k_len - j0);
        pack_keys(b, kv, j0, n, kp + offset(b, kv));
        pack_values(b, kv, j0, n, vp + offset(b, kv));
      }
      head.store(2, std::memory_order_release);
      return;
    }
    while (head.load(std::memory_order_acquire) != 2) std::this_thread::yield();
  }
  // k^T for keys [j0, j0 + n) into the head's (d / 2, padded, 2), zero past the last key: one product reads a
  // block's keys whole (docs/performance.md, "bfloat16, forward"). A pair of bf16 is 32 bits, so this is the
  // transpose of the keys' rows read as (n, d / 2) 32-bit words.
  void pack_keys(int64_t b, int64_t kv, int64_t j0, int64_t n, BF* head) const {
    auto* out = reinterpret_cast<uint32_t*>(head) + j0;
    const int64_t words = d / 2;
#ifdef __AVX512BF16__
    for (int64_t jt = 0; jt < VNNI_N; jt += 16)  // in tiles of 16 keys by 16 words
      for (int64_t w0 = 0; w0 < words; w0 += 16) {
        const __mmask16 part = below(w0, words);
        __m512i tile[16];
        for (int64_t j = 0; j < 16; ++j)
          tile[j] = jt + j < n ? _mm512_maskz_loadu_epi32(part, K.at(b, kv, j0 + jt + j) + 2 * w0)
                               : _mm512_setzero_si512();
        transpose(tile);
        for (int64_t w = 0; w < std::min<int64_t>(16, words - w0); ++w)
          _mm512_storeu_si512(out + (w0 + w) * padded + jt, tile[w]);
      }
#else
    for (int64_t j = 0; j < VNNI_N; ++j) {
      const auto* row = reinterpret_cast<const uint32_t*>(K.at(b, kv, j0 + std::min(j, n - 1)));
      for (int64_t c = 0; c < words; ++c) out[c * padded + j] = j < n ? row[c] : 0u;
    }
#endif
  }
  // v for keys [j0, j0 + n), per 64 of its columns: (k_len / 2, 64, 2) over all keys, zero past the last key;
  // pairs of rows, interleaved
  void pack_values(int64_t b, int64_t kv, int64_t j0, int64_t n, BF* head) const {
    for (int64_t c0 = 0; c0 < d; c0 += VNNI_N) {
      const int64_t width = std::min(VNNI_N, d - c0);
      BF* to = head + c0 * padded + j0 * width;
      for (int64_t j = 0; j < VNNI_N; j += 2) {
        const BF* even = j < n ? V.at(b, kv, j0 + j) + c0 : nullptr;
        const BF* odd = j + 1 < n ? V.at(b, kv, j0 + j + 1) + c0 : nullptr;
#ifdef __AVX512BF16__
        // unpack interleaves within 128-bit lanes: lo holds columns 0-3, 8-11, 16-19, 24-27, hi the others
        const __m512i first_half = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
        const __m512i second_half = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
        for (int64_t c = 0; c < width; c += 32) {  // width is a multiple of 16
          const __mmask32 part = width - c >= 32 ? 0xFFFFFFFFu : 0xFFFFu;
          const __m512i a = even ? _mm512_maskz_loadu_epi16(part, even + c) : _mm512_setzero_si512();
          const __m512i z = odd ? _mm512_maskz_loadu_epi16(part, odd + c) : _mm512_setzero_si512();
          const __m512i lo = _mm512_unpacklo_epi16(a, z), hi = _mm512_unpackhi_epi16(a, z);
          _mm512_storeu_si512(to + j * width + 2 * c, _mm512_permutex2var_epi64(lo, first_half, hi));
          if (width - c >= 32)
            _mm512_storeu_si512(to + j * width + 2 * c + 32, _mm512_permutex2var_epi64(lo, second_half, hi));
        }
#else
        const BF zero(0.0f);
        for (int64_t c = 0; c < width; ++c) {
          to[j * width + 2 * c] = even ? even[c] : zero;
          to[j * width + 2 * c + 1] = odd ? odd[c] : zero;
        }
#endif
      }
    }
  }
#ifdef __AVX512BF16__
  // 16 x 16 32-bit words, transposed in place: pairs of rows interleaved by 32 bits, then by 64, then 128-bit
  // lanes exchanged twice
  static void transpose(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
      t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; ++i) {
      r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
  }
#endif
  // s (rows, cols) = q k^T, keys [j0, j0 + cols), j0 a multiple of 64; columns up to the next 64 are computed
  // (from zero keys) and not read
  void scores(int64_t rows, int64_t cols, const BF* q, int64_t ld_q, int64_t b, int64_t kv, int64_t j0,
              float* s, Local&) const {
    const BF* k_head = kp + offset(b, kv);
    const int64_t n = (cols + VNNI_N - 1) / VNNI_N * VNNI_N;
    cpublas::brgemm(rows, n, d, ld_q, padded, ROW, false, q, k_head + 2 * j0, s);
  }
  // acc (rows, d) += p v; p's columns from cols up to an even count must be 0
  void add_weighted(int64_t rows, int64_t cols, const BF* p, int64_t b, int64_t kv, int64_t j0, float* acc,
                    Local&) const {
    const BF* v_head = vp + offset(b, kv);
    const int64_t even = cols + cols % 2;
    for (int64_t c0 = 0; c0 < d; c0 += VNNI_N) {
      const int64_t width = std::min(VNNI_N, d - c0);
      cpublas::brgemm(rows, width, even, ROW, width, d, true, p, v_head + c0 * padded + j0 * width, acc + c0);
    }
  }
  static void release() { cpublas::brgemm_release(); }
};

// Products: Plain, Packed or Widened. T: q's dtype; A: the dtype of the scores and the softmax, float for bfloat16,
// else T; W (Products::Weight): the weights' dtype in the product with v (Packed rounds them to bfloat16).
template <typename T, typename Products>
void forward_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const at::opmath_type<T>* slopes, const Seen* seen, at::opmath_type<T> scale, const Shape& sh,
                    torch::Tensor& out, torch::Tensor& lse) {
  using A = at::opmath_type<T>;
  constexpr int64_t Q_ROWS = Products::Q_ROWS;
  using W = typename Products::Weight;
  constexpr bool rounded = !std::is_same_v<W, A>;
  const Products products(k, v, sh);
  const Rows<T> Q(q), O(out);
  A* lse_data = lse.data_ptr<A>();  // (B, H, i), contiguous
  const int64_t d = sh.d, q_blocks = (sh.q_len + Q_ROWS - 1) / Q_ROWS;
  struct Buffers {
    Scratch<A> s, acc, row_max, row_sum;
    Scratch<W> weights;  // rounded weights only
    typename Products::Local local;
  };
  auto make = [&] { return Buffers{Scratch<A>(Q_ROWS * ROW), Scratch<A>(Q_ROWS * d), Scratch<A>(Q_ROWS),
                                   Scratch<A>(Q_ROWS), Scratch<W>(rounded ? Q_ROWS * ROW : 0),
                                   typename Products::Local(d)}; };
  // the costliest first, so that the last tasks are short: the last query blocks (most keys under a causal
  // mask), then the last heads (the flattest slopes, whose reach is longest)
  each_task(sh.batch * sh.heads * q_blocks, make, [&](int64_t task, Buffers& buffers) {
      auto& [s, acc, row_max, row_sum, rounded_weights, local] = buffers;
      W* weights = rounded ? rounded_weights.data() : reinterpret_cast<W*>(s.data());  // W is A where not rounded
      const int64_t i0 = (q_blocks - 1 - task / (sh.batch * sh.heads)) * Q_ROWS;
      const int64_t h = sh.heads - 1 - task % sh.heads, b = task / sh.heads % sh.batch;
      const int64_t rows = std::min(Q_ROWS, sh.q_len - i0), kv = h / sh.groups;
      products.ready(b, kv);
      const A m = slopes[h];
      const Seen& w = seen[h];
      std::fill(acc.data(), acc.data() + rows * d, A(0));
      std::fill(row_max.data(), row_max.data() + rows, -std::numeric_limits<A>::infinity());
      std::fill(row_sum.data(), row_sum.data() + rows, A(0));
      const int64_t last = w.last(sh, i0, rows);
      for (int64_t j0 = w.first(sh, i0) / Products::ALIGN * Products::ALIGN; j0 < last; j0 += K_BLOCK) {
        const int64_t cols = std::min(K_BLOCK, last - j0);
        products.scores(rows, cols, Q.at(b, h, i0), Q.sn, b, kv, j0, s.data(), local);  // (rows, cols) = q k^T
        for (int64_t r = 0; r < rows; ++r) {
          A* row = s.data() + r * ROW;
          W* weight = weights + r * ROW;
          int64_t lo, hi;
          w.columns(sh, i0 + r, j0, cols, lo, hi);
          const A first = static_cast<A>(j0 - (i0 + r + sh.offset));  // p_j - p_i at the block's first key
          const A new_max = std::max(row_max[r], add_bias(row, lo, hi, scale, m, first));
          const A block_sum = exponentiate(row, weight, lo, hi, new_max);
          std::fill(weight, weight + lo, W(0));  // keys the query does not see, and one past an odd count
          std::fill(weight + hi, weight + cols + cols % 2, W(0));
          if (lo >= hi) continue;
          // online softmax: the sum and output so far were weighed against the old maximum
          const A rescale = exp_weight(row_max[r] - new_max);
          row_max[r] = new_max;
          row_sum[r] = row_sum[r] * rescale + block_sum;
          if (rescale != A(1)) {
            A* a = acc.data() + r * d;
            for (int64_t c = 0; c < d; ++c) a[c] *= rescale;
          }
        }
        products.add_weighted(rows, cols, weights, b, kv, j0, acc.data(), local);  // += p v
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* o = O.at(b, h, i0 + r);
        const A inverse = A(1) / row_sum[r];
        for (int64_t c = 0; c < d; ++c) o[c] = static_cast<T>(acc[r * d + c] * inverse);
        lse_data[(b * sh.heads + h) * sh.q_len + i0 + r] = row_max[r] + std::log(row_sum[r]);
      }
  }, Products::release);
}

// Per (b, h): dq, that query head's dk and dv (summed over a KV head's group by the caller), and with
// slope_grads the slope's gradient sum_ij ds_ij (-|p_i - p_j|); ds = p (dp - delta), dp = do v^T,
// delta_i = do_i . o_i (the softmax's backward, Dao et al.'s D).
template <typename T>
void backward_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& out, const torch::Tensor& grad_out, const torch::Tensor& lse,
                     const T* slopes, const Seen* seen, T scale, const Shape& sh, bool slope_grads,
                     torch::Tensor& dq, torch::Tensor& dk, torch::Tensor& dv, torch::Tensor& dslopes) {
  const Rows<T> Q(q), K(k), V(v), O(out), dO(grad_out), dQ(dq), dK(dk), dV(dv);
  const T* lse_data = lse.data_ptr<T>();
  T* dslope_data = dslopes.data_ptr<T>();  // (B, H): summed over the batch by the caller
  const int64_t d = sh.d;
  struct Buffers {
    Scratch<T> p, ds, delta;
  };
  auto make = [&] { return Buffers{Scratch<T>(Q_BLOCK * ROW), Scratch<T>(Q_BLOCK * ROW), Scratch<T>(Q_BLOCK)};
  };
  each_task(sh.batch * sh.heads, make, [&](int64_t task, Buffers& buffers) {  // the flattest heads first
      auto& [p, ds, delta] = buffers;
      const int64_t h = sh.heads - 1 - task % sh.heads, b = task / sh.heads, kv = h / sh.groups;
      const T m = slopes[h];
      const Seen& w = seen[h];
      const T* lse_h = lse_data + (b * sh.heads + h) * sh.q_len;
      T slope_grad = 0;
      for (int64_t j = 0; j < sh.k_len; ++j) {  // added to block by block; keys no query sees keep 0
        std::fill(dK.at(b, h, j), dK.at(b, h, j) + d, T(0));
        std::fill(dV.at(b, h, j), dV.at(b, h, j) + d, T(0));
      }
      for (int64_t i0 = 0; i0 < sh.q_len; i0 += Q_BLOCK) {
        const int64_t rows = std::min(Q_BLOCK, sh.q_len - i0);
        for (int64_t r = 0; r < rows; ++r) {
          const T* o = O.at(b, h, i0 + r);
          const T* g = dO.at(b, h, i0 + r);
          T dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += o[c] * g[c];
          delta[r] = dot;
          std::fill(dQ.at(b, h, i0 + r), dQ.at(b, h, i0 + r) + d, T(0));
        }
        const int64_t last = w.last(sh, i0, rows);
        for (int64_t j0 = w.first(sh, i0); j0 < last; j0 += K_BLOCK) {
          const int64_t cols = std::min(K_BLOCK, last - j0);
          times_transposed<T>(rows, cols, d, T(1), Q.at(b, h, i0), Q.sn, K.at(b, kv, j0), K.sn, T(0), p.data(),
                              ROW);
          for (int64_t r = 0; r < rows; ++r) {  // the weights, p = exp(s - m |p_i - p_j| - lse)
            T* row = p.data() + r * ROW;
            int64_t lo, hi;
            w.columns(sh, i0 + r, j0, cols, lo, hi);
            const T first = static_cast<T>(j0 - (i0 + r + sh.offset));
            add_bias(row, lo, hi, scale, m, first);  // the forward's two passes, the log-sum-exp for the row's maximum
            exponentiate(row, row, lo, hi, lse_h[i0 + r]);
            std::fill(row, row + lo, T(0));
            std::fill(row + hi, row + cols, T(0));
          }
          // dv += p^T do; dp = do v^T
          transposed_times<T>(cols, d, rows, T(1), p.data(), ROW, dO.at(b, h, i0), dO.sn, T(1),
                              dV.at(b, h, j0), dV.sn);
          times_transposed<T>(rows, cols, d, T(1), dO.at(b, h, i0), dO.sn, V.at(b, kv, j0), V.sn, T(0), ds.data(),
                              ROW);
          for (int64_t r = 0; r < rows; ++r) {
            T* g = ds.data() + r * ROW;
            const T* weight = p.data() + r * ROW;
            const T dr = delta[r];
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) g[c] = weight[c] * (g[c] - dr);
            if (!slope_grads) continue;
            const T first = static_cast<T>(j0 - (i0 + r + sh.offset));
            T row_grad = 0;
#pragma omp simd reduction(+ : row_grad)
            for (int64_t c = 0; c < cols; ++c) row_grad -= g[c] * std::fabs(first + static_cast<T>(c));
            slope_grad += row_grad;
          }
          // dq += scale ds k; dk += scale ds^T q
          times<T>(rows, d, cols, scale, ds.data(), ROW, K.at(b, kv, j0), K.sn, T(1), dQ.at(b, h, i0), dQ.sn);
          transposed_times<T>(cols, d, rows, scale, ds.data(), ROW, Q.at(b, h, i0), Q.sn, T(1),
                              dK.at(b, h, j0), dK.sn);
        }
      }
      dslope_data[b * sh.heads + h] = slope_grad;
  });
}

Shape shape_of(const torch::Tensor& q, const torch::Tensor& k) {
  return {q.size(0), q.size(1), q.size(1) / k.size(1), q.size(2), k.size(2), q.size(3), k.size(2) - q.size(2)};
}

// each head's (left, right) from (H, 2) integers, -1 for no limit; causal caps right at 0
std::vector<Seen> seen_of(const torch::Tensor& windows, const Shape& sh, bool causal) {
  TORCH_CHECK(windows.dim() == 2 && windows.size(0) == sh.heads && windows.size(1) == 2,
              "windows must be (H, 2), one (left, right) per query head");
  auto w = windows.to(torch::kLong).contiguous();
  const int64_t* data = w.data_ptr<int64_t>();
  const int64_t far = sh.q_len + sh.k_len;  // farther than any two positions apart
  std::vector<Seen> seen(sh.heads);
  for (int64_t h = 0; h < sh.heads; ++h) {
    const int64_t left = data[2 * h], right = data[2 * h + 1];
    seen[h] = {left < 0 ? far : left, causal ? 0 : (right < 0 ? far : right)};
  }
  return seen;
}

void check(const torch::Tensor& x, const char* name, const torch::Tensor& q) {
  TORCH_CHECK(x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == q.scalar_type() && x.stride(3) == 1,
              name, " must be a (B, H, n, d) CPU tensor of q's dtype with unit stride along d");
}

template <typename T>
void longest_kernel(const torch::Tensor& x, double* longest) {
  const Rows<T> X(x);
  const int64_t batch = x.size(0), heads = x.size(1), n = x.size(2), d = x.size(3);
  at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      at::opmath_type<T> most = 0;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < n; ++i) {
          const T* row = X.at(b, h, i);
          at::opmath_type<T> squares = 0;
#pragma omp simd reduction(+ : squares)
          for (int64_t c = 0; c < d; ++c) squares += static_cast<at::opmath_type<T>>(row[c]) * row[c];
          most = squares > most || squares != squares ? squares : most;  // a NaN row makes the bound NaN
        }
      longest[h] = std::sqrt(static_cast<double>(most));
    }
  });
}

}  // namespace

// (H,) float64: each head's longest row, max over b and i of |x_bhi|, for x (B, H, n, d) with a unit stride along d
// (the bound alibi_ref.reach takes each head's reach from; torch's norm of a bfloat16 tensor took longer than
// the kernel's forward saves at 1024 keys)
torch::Tensor longest_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 4 && x.device().is_cpu() && x.stride(3) == 1,
              "x must be a (B, H, n, d) CPU tensor with unit stride along d");
  auto longest = torch::empty({x.size(1)}, x.options().dtype(torch::kDouble));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "longest_rows", [&] {
    longest_kernel<scalar_t>(x, longest.data_ptr<double>());
  });
  return longest;
}

// (out (B, H, i, d), lse (B, H, i), float32 for bfloat16) for q (B, H, i, d), k and v (B, H_kv, j, d), slopes (H,)
std::vector<torch::Tensor> forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor slopes,
                                   torch::Tensor windows, double scale, bool causal) {
  for (auto [x, name] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}}) check(x, name, q);
  const Shape sh = shape_of(q, k);
  const auto seen = seen_of(windows, sh, causal);
  auto out = torch::empty({sh.batch, sh.heads, sh.q_len, sh.d}, q.options());
  const auto accumulate = at::toOpMathType(q.scalar_type());  // float for bfloat16
  auto lse = torch::empty({sh.batch, sh.heads, sh.q_len}, q.options().dtype(accumulate));
  auto m = slopes.to(accumulate).contiguous();
  if (q.scalar_type() == at::kBFloat16 && !takes_bfloat16()) {  // no brgemm for it: float32's products
    forward_kernel<at::BFloat16, Widened>(q, k, v, m.data_ptr<float>(), seen.data(), static_cast<float>(scale), sh,
                                          out, lse);
    return {out, lse};
  }
  if (q.scalar_type() == at::kBFloat16) {
    TORCH_CHECK(sh.d % 16 == 0, "bfloat16 needs a head size that is a multiple of 16, got ", sh.d);
    forward_kernel<at::BFloat16, Packed>(q, k, v, m.data_ptr<float>(), seen.data(), static_cast<float>(scale), sh,
                                         out, lse);
    return {out, lse};
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_alibi_forward", [&] {
    forward_kernel<scalar_t, Plain<scalar_t>>(q, k, v, m.data_ptr<scalar_t>(), seen.data(),
                                              static_cast<scalar_t>(scale), sh, out, lse);
  });
  return {out, lse};
}

// (dq, dk, dv, dslopes): dk, dv (B, H_kv, j, d) summed over each KV head's query heads; dslopes (H,)
std::vector<torch::Tensor> backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out,
                                    torch::Tensor grad_out, torch::Tensor lse, torch::Tensor slopes,
                                    torch::Tensor windows, double scale, bool causal, bool slope_grads) {
  for (auto [x, name] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {grad_out, "grad_out"}}) {
    check(x, name, q);
  }
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "the backward takes float32 and float64, got ", q.scalar_type());
  const Shape sh = shape_of(q, k);
  const auto seen = seen_of(windows, sh, causal);
  auto dq = torch::empty({sh.batch, sh.heads, sh.q_len, sh.d}, q.options());
  auto dk = torch::empty({sh.batch, sh.heads, sh.k_len, sh.d}, q.options());  // per query head
  auto dv = torch::empty({sh.batch, sh.heads, sh.k_len, sh.d}, q.options());
  auto dslopes = torch::empty({sh.batch, sh.heads}, q.options());
  auto m = slopes.to(q.scalar_type()).contiguous();
  auto l = lse.contiguous();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_alibi_backward", [&] {
    backward_kernel<scalar_t>(q, k, v, out, grad_out, l, m.data_ptr<scalar_t>(), seen.data(),
                              static_cast<scalar_t>(scale), sh, slope_grads, dq, dk, dv, dslopes);
  });
  if (sh.groups > 1) {  // (B, H, j, d) -> (B, H_kv, groups, j, d), summed over the group
    dk = dk.view({sh.batch, sh.heads / sh.groups, sh.groups, sh.k_len, sh.d}).sum(2);
    dv = dv.view({sh.batch, sh.heads / sh.groups, sh.groups, sh.k_len, sh.d}).sum(2);
  }
  return {dq, dk, dv, dslopes.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "ALiBi attention: (out, log-sum-exp)");
  module.def("backward", &backward, "gradients of q, k, v and the slopes");
  module.def("longest_rows", &longest_rows, "each head's longest row of x (B, H, n, d)");
  module.def("takes_bfloat16", &takes_bfloat16, "whether bfloat16's products run in bfloat16 (brgemm); else in float32");
}
