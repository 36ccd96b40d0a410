/* Helpers every generated program includes: integer division as numpy does it, stable sigmoid/tanh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
static inline int nf_nthreads(void) { return omp_get_max_threads(); }
static inline int nf_thread(void) { return omp_get_thread_num(); }
static inline int nf_team(void) { return omp_get_num_threads(); }
#else
static inline int nf_nthreads(void) { return 1; }
static inline int nf_thread(void) { return 0; }
static inline int nf_team(void) { return 1; }
#endif
static inline int64_t nf_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t nf_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return q - ((a % b != 0) && ((a < 0) != (b < 0))); }
static inline int64_t nf_mod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t nf_idiv_int64_t(int64_t a, int64_t b) { return b == 0 ? 0 : nf_floordiv(a, b); }
static inline int32_t nf_idiv_int32_t(int32_t a, int32_t b) { return b == 0 ? 0 : (int32_t)nf_floordiv(a, b); }
static inline uint8_t nf_idiv_uint8_t(uint8_t a, uint8_t b) { return b == 0 ? 0 : a / b; }
/* A negative power is torch's: 1 for 1, +-1 for -1, else 0 (the quotient's integer part). */
static inline int64_t nf_ipow(int64_t a, int64_t b) {
    int64_t r = 1;
    if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
static inline double nf_sigmoid(double x) { double e = exp(-fabs(x)); return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e); }
static inline double nf_tanh(double x) { return tanh(x); }
/* Random numbers (Random kernels): element i of a draw is a pure function of (key, i), the key mixing the call's
   seed, the draw's number and the enclosing loops' iterations. nf_mix64 is SplitMix64's finalizer (a bijection
   with full avalanche); uniforms take the top 24 / 53 bits, normals pair two uniforms (Box-Muller, the cosine). */
static inline uint64_t nf_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t nf_bits64(uint64_t key, uint64_t i) { return nf_mix64(key ^ nf_mix64(i)); }
static inline float nf_uniformf(uint64_t key, int64_t i) { return (float)(nf_bits64(key, (uint64_t)i) >> 40) * 0x1p-24f; }
static inline double nf_uniform(uint64_t key, int64_t i) { return (double)(nf_bits64(key, (uint64_t)i) >> 11) * 0x1p-53; }
static inline double nf_normal(uint64_t key, int64_t i) {
    double u1 = ((double)(nf_bits64(key, 2 * (uint64_t)i) >> 11) + 1.0) * 0x1p-53;  /* (0, 1]: log(u1) is finite */
    double u2 = (double)(nf_bits64(key, 2 * (uint64_t)i + 1) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
/* float32 transcendental kernels written so that -O3 vectorizes them (no libm call in the loop); error ~2 ulp.
   The polynomials are macros shared by the scalar forms and the vector forms below (operands of either type):
   e^x = 2^n e^r with r = x - n ln 2 (ln 2 in two parts), e^r = 1 + r + r^2 P(r), P of degree 5 evaluated in
   Estrin's form (pairs, then powers of r^2: three dependent multiply-adds where Horner's form has six; a layer-norm
   LSTM step, whose cell is mostly sigmoids, took 0.7 % less); tanh = c P(c^2) / Q(c^2).
   NF_EXP_POLY_S(q, -) is e^-q's polynomial: the odd terms' signs flipped, the same operations on negated
   values, so e^r from q = -r rounds exactly as from r (the sigmoid's e^-x without negating x). */
#define NF_EXP_R(x, n) ((x) - (n) * 0.693359375f + (n) * 2.12194440e-4f)
#define NF_EXP_POLY_S(r, S) ((((((S 1.9875691500E-4f) * (r) + 1.3981999507E-3f) * ((r) * (r)) \
    + ((S 8.3334519073E-3f) * (r) + 4.1665795894E-2f)) * ((r) * (r)) \
    + ((S 1.6666665459E-1f) * (r) + 5.0000001201E-1f)) * ((r) * (r)) S (r)) + 1.0f)
#define NF_EXP_POLY(r) NF_EXP_POLY_S(r, +)
#define NF_TANH_P(s) ((((1.3737804e-08f * (s) + 2.0890167e-05f) * (s) + 0.003512878f) * (s) + 0.13395657f) * (s) + 1.0f)
#define NF_TANH_Q(s) ((((7.9347086e-07f * (s) + 0.00033137616f) * (s) + 0.025942983f) * (s) + 0.46728981f) * (s) + 1.0f)
/* 2^n is applied as 2^(n >> 1) 2^(n - (n >> 1)), both factors normal: results in the subnormal range round once, as
   libm's do, and x >= 89 gives inf (the clamps only keep n in range: e^-104 is 0 in float32, e^89 is inf). Inline,
   so a log-sum-exp pays neither a call nor libm's out-of-range path per element (expf's underflow handler took
   0.9 % of a CTC training step, expf itself 2.7 %). */
static inline float nf_expf(float x) {
    x = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
    const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = NF_EXP_R(x, n);
    const float p = NF_EXP_POLY(r);
    const int32_t ni = (int32_t)n, h = ni >> 1;
    const uint32_t b1 = (uint32_t)(h + 127) << 23, b2 = (uint32_t)(ni - h + 127) << 23;
    float s1, s2; memcpy(&s1, &b1, 4); memcpy(&s2, &b2, 4);
    return p * s1 * s2;
}
/* 1 / (1 + e^-x) needs no sign split: e^-x is inf for x <= -89 (the result is then 0, as it should be) and
   relative error stays ~2 ulp for x < 0 too. */
static inline float nf_sigmoidf(float x) { return 1.0f / (1.0f + nf_expf(-x)); }
/* tanh as x * P(x^2) / Q(x^2) on |x| <= 9 (beyond, tanh rounds to +-1 in float32): a rational fit of degree 9/8
   made for nnforge (iteratively reweighted least squares on the relative error), max relative error 2.7e-7 over
   all floats in float32 arithmetic; no exp, one division, no branches but the clamp, which keeps NaN a NaN. */
static inline float nf_tanhf(float x) {
    const float c = x > 9.0f ? 9.0f : (x < -9.0f ? -9.0f : x);
    const float s = c * c;
    return c * NF_TANH_P(s) / NF_TANH_Q(s);
}
/* log x = n ln 2 + log m with x = m 2^n, m in [sqrt(1/2), sqrt(2)) (n and m read off x's bits: subtracting
   sqrt(1/2)'s bits and shifting gives n, subtracting n from the exponent field gives m; subnormals scaled by 2^23
   first), log m = f - f^2 / 2 + f^3 P(f) with f = m - 1 exact, P of degree 8 (Cephes' logf coefficients), and
   n ln 2 added in two parts (as NF_EXP_R). Zero gives -inf, +inf itself, a negative or NaN input NaN. Written with
   selects, not branches, so the scalar and vector forms do the same operations (~1 ulp; a CTC recursion took a
   libm call per element). */
#define NF_LOG_P(f) ((((((((7.0376836292E-2f * (f) - 1.1514610310E-1f) * (f) + 1.1676998740E-1f) * (f) \
    - 1.2420140846E-1f) * (f) + 1.4249322787E-1f) * (f) - 1.6668057665E-1f) * (f) + 2.0000714765E-1f) * (f) \
    - 2.4999993993E-1f) * (f) + 3.3333331174E-1f)
#define NF_LOG_M(f, n) ((f) + ((f) * ((f) * (f)) * NF_LOG_P(f) + (n) * -2.12194440e-4f - 0.5f * ((f) * (f))) \
    + (n) * 0.693359375f)
static inline float nf_logf(float x) {
    const int tiny = x < 1.17549435e-38f;
    const float s = tiny ? x * 8388608.0f : x;
    uint32_t b; memcpy(&b, &s, 4);
    const int32_t e = (int32_t)(b - 0x3f3504f3u) >> 23;
    const uint32_t mb = b - ((uint32_t)e << 23);
    float m; memcpy(&m, &mb, 4);
    const float f = m - 1.0f, n = (float)e - (tiny ? 23.0f : 0.0f);
    const float r = NF_LOG_M(f, n);
    return x == INFINITY ? x : (x == 0.0f ? -INFINITY : (x > 0.0f ? r : NAN));
}
/* erf as x P(x^2) on |x| <= 1 and 1 - e^R(|x| - 2.5) beyond, R fitting log erfc on [1, 4] (erf rounds to 1 in
   float32 from 3.92 on, so |x| is clamped to 4; the clamp keeps NaN a NaN): both fitted for nnforge by iteratively
   reweighted least squares against float64 erf, P (degree 6) to a relative error of 1.2e-9, R (degree 8) to an
   absolute one of 1.2e-8; ~3 ulp in float32 arithmetic. A GELU's erf was libm's erff, a call per element (16 % of
   a GPT block's inference samples). */
#define NF_ERF_P(s) ((((((7.853858e-05f * (s) - 0.00080101925f) * (s) + 0.0051883277f) * (s) - 0.026853811f) \
    * (s) + 0.112835854f) * (s) - 0.37612626f) * (s) + 1.1283791f)
#define NF_ERF_R(u) ((((((((1.5998191e-06f * (u) - 1.3301709e-05f) * (u) + 7.745492e-05f) * (u) - 0.00042017314f) \
    * (u) + 0.0021650814f) * (u) - 0.010858487f) * (u) - 0.9438936f) * (u) - 5.3526807f) * (u) - 7.806815f)
static inline float nf_erff(float x) {
    const float t = __builtin_fabsf(x);
    if (t <= 1.0f) return x * NF_ERF_P(x * x);
    const float e = 1.0f - nf_expf(NF_ERF_R((t > 4.0f ? 4.0f : t) - 2.5f));
    return x < 0 ? -e : e;
}
/* Vector forms (GCC/Clang vector extensions) of the float32 ops that fused GEMM tiles and elementwise kernels
   compute, a vector of columns at a time: NF_VBYTES bytes (32, eight lanes, unless the program says 64: sixteen
   lanes where the compiler targets AVX-512; narrower hardware runs either as halves). Written out because the
   compiler's own vectorization of the scalar forms above is poor: it if-converts each clamp into blends of whole
   results (the clamped branch is a constant it folds through the polynomial: three compares and three blends per
   clamp) and guards every tile row with aliasing checks. Same polynomials as the scalar forms; the clamps keep
   NaN a NaN; n is rounded to nearest (the scalar form rounds half up: they differ only at exact ties, both
   ~2 ulp). */
typedef float nf_v8f32 __attribute__((vector_size(32), aligned(32)));
typedef double nf_v4f64 __attribute__((vector_size(32), aligned(32)));
/* The GEMM micro-kernels' vectors on AVX-512 (``GemmConfig.vector_bytes`` 64); two AVX2 halves elsewhere. */
typedef float nf_v16f32 __attribute__((vector_size(64), aligned(64)));
typedef double nf_v8f64 __attribute__((vector_size(64), aligned(64)));
#ifndef NF_VBYTES
#define NF_VBYTES 32
#endif
typedef float nf_vf32 __attribute__((vector_size(NF_VBYTES), aligned(NF_VBYTES)));
typedef int32_t nf_vi32 __attribute__((vector_size(NF_VBYTES), aligned(NF_VBYTES)));
typedef uint32_t nf_vu32 __attribute__((vector_size(NF_VBYTES), aligned(NF_VBYTES)));
typedef float nf_vf32u __attribute__((vector_size(NF_VBYTES), aligned(4)));
static inline nf_vf32 nf_vld_f32(const float* p) { return *(const nf_vf32u*)p; }
static inline void nf_vst_f32(float* p, nf_vf32 v) { *(nf_vf32u*)p = v; }
/* x - 0 is x for every float, -0 and NaN included; the scalar operand is broadcast. */
static inline nf_vf32 nf_vbc_f32(float x) { return x - (nf_vf32){0}; }
static inline nf_vf32 nf_vsel_f32(nf_vi32 m, nf_vf32 a, nf_vf32 b) {
    return (nf_vf32)((m & (nf_vi32)a) | (~m & (nf_vi32)b));
}
/* A bool vector is a mask of 32-bit lanes (all ones or zero), lane for lane with the float32 values it selects;
   in memory one byte a value, so a mask loads from and stores to NF_VBYTES / 4 bytes. */
typedef uint8_t nf_vb8u __attribute__((vector_size(NF_VBYTES / 4), aligned(1)));
static inline nf_vi32 nf_vld_b(const uint8_t* p) {
    return __builtin_convertvector(*(const nf_vb8u*)p, nf_vi32) != 0;
}
static inline void nf_vst_b(uint8_t* p, nf_vi32 m) { *(nf_vb8u*)p = __builtin_convertvector(m & 1, nf_vb8u); }
static inline nf_vi32 nf_vbc_b(uint8_t x) { return (nf_vi32){0} - (int32_t)(x != 0); }
static inline nf_vf32 nf_vmaxf(nf_vf32 a, nf_vf32 b) { return nf_vsel_f32((a > b) | (a != a), a, b); }
static inline nf_vf32 nf_vminf(nf_vf32 a, nf_vf32 b) { return nf_vsel_f32((a < b) | (a != a), a, b); }
static inline nf_vf32 nf_vabsf(nf_vf32 a) { return (nf_vf32)((nf_vi32)a & 0x7fffffff); }
/* x clamped to [lo, hi], NaN kept: min(hi, x) is hi < x ? hi : x, as vminps computes it (the second operand
   where either is NaN). On AVX one vminps and one vmaxps; compare and select (what the generic form compiles to)
   makes a whole LSTM cell update ~25 % slower. (GCC's names of the AVX-512 builtins; other compilers take the
   generic form.) */
#if NF_VBYTES == 64 && defined(__AVX512F__) && !defined(__clang__)
static inline nf_vf32 nf_vclampf(nf_vf32 x, float lo, float hi) {
    const nf_vf32 l = nf_vbc_f32(lo), h = nf_vbc_f32(hi), u = nf_vbc_f32(0);
    return __builtin_ia32_maxps512_mask(l, __builtin_ia32_minps512_mask(h, x, u, (uint16_t)-1, 4), u,
                                        (uint16_t)-1, 4);
}
static inline nf_vf32 nf_vsqrtf(nf_vf32 x) {
    return __builtin_ia32_sqrtps512_mask(x, nf_vbc_f32(0), (uint16_t)-1, 4);
}
#elif NF_VBYTES == 32 && defined(__AVX__)
static inline nf_vf32 nf_vclampf(nf_vf32 x, float lo, float hi) {
    return __builtin_ia32_maxps256(nf_vbc_f32(lo), __builtin_ia32_minps256(nf_vbc_f32(hi), x));
}
static inline nf_vf32 nf_vsqrtf(nf_vf32 x) { return __builtin_ia32_sqrtps256(x); }
#else
static inline nf_vf32 nf_vclampf(nf_vf32 x, float lo, float hi) {
    x = nf_vsel_f32(x > hi, nf_vbc_f32(hi), x);
    return nf_vsel_f32(x < lo, nf_vbc_f32(lo), x);
}
static inline nf_vf32 nf_vsqrtf(nf_vf32 x) {
    for (int k = 0; k < NF_VBYTES / 4; k++) x[k] = sqrtf(x[k]);
    return x;
}
#endif
/* Row sums of float32 vectors kept in float64 (as the scalar sums are): each half of the lanes widened into an
   accumulator (vcvtps2pd), and their total. */
#if NF_VBYTES == 64
typedef nf_v8f64 nf_vf64;
static inline void nf_vacc_f64(nf_vf64* lo, nf_vf64* hi, nf_vf32 v) {
    *lo += (nf_vf64){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
    *hi += (nf_vf64){v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]};
}
static inline double nf_vhsum_f64(nf_vf64 lo, nf_vf64 hi) {
    const nf_vf64 t = lo + hi;
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#else
typedef nf_v4f64 nf_vf64;
static inline void nf_vacc_f64(nf_vf64* lo, nf_vf64* hi, nf_vf32 v) {
    *lo += (nf_vf64){v[0], v[1], v[2], v[3]};
    *hi += (nf_vf64){v[4], v[5], v[6], v[7]};
}
static inline double nf_vhsum_f64(nf_vf64 lo, nf_vf64 hi) {
    const nf_vf64 t = lo + hi;
    return (t[0] + t[1]) + (t[2] + t[3]);
}
#endif
/* n = round(x / ln 2) from t = x log2(e) + (1.5 * 2^23 + 127): t is an integer in [2^23, 2^24) whose low mantissa
   bits hold n + 127 (in [1, 254] after the sigmoid's clamp), so t's bits shifted left by 23 are those of 2^n (no
   conversion to int, no + 127: two vector ops fewer per e^-x). */
#define NF_EXP_MAGIC 12583039.0f
/* e^x as nf_expf computes it (the same clamps, polynomial and 2^n in two normal factors: subnormal results round
   once, x >= 89 gives inf), n from t as above but converted to int to be split. */
static inline nf_vf32 nf_vexpf(nf_vf32 x) {
    x = nf_vclampf(x, -104.0f, 89.0f);
    const nf_vf32 t = x * 1.44269504088896341f + NF_EXP_MAGIC;
    const nf_vf32 n = t - NF_EXP_MAGIC;
    const nf_vi32 ni = __builtin_convertvector(n, nf_vi32), h = ni >> 1;
    return NF_EXP_POLY(NF_EXP_R(x, n)) * (nf_vf32)((h + 127) << 23) * (nf_vf32)((ni - h + 127) << 23);
}
/* 1 / (1 + e^-x), e^-x evaluated on x (q = -r, see NF_EXP_POLY_S): e^-x's polynomial and 2^-n in one factor
   (the clamp keeps n in range), three ops fewer than negating x; an LSTM cell update (three sigmoids, two tanh)
   took 8.6 % less in isolation. */
static inline nf_vf32 nf_vsigmoidf(nf_vf32 x) {
    x = nf_vclampf(x, -88.0f, 87.0f);
    const nf_vf32 t = x * -1.44269504088896341f + NF_EXP_MAGIC;
    const nf_vf32 n = t - NF_EXP_MAGIC;
    const nf_vf32 q = NF_EXP_R(x, -n);  /* = -r: x - (-n) ln 2, the negation folded into the multiply-adds */
    return 1.0f / (1.0f + NF_EXP_POLY_S(q, -) * (nf_vf32)((nf_vu32)t << 23));
}
/* nf_erff's two branches, selected per lane; the far one's sign from x (e >= 0). */
static inline nf_vf32 nf_verff(nf_vf32 x) {
    const nf_vf32 t = nf_vabsf(x);
    const nf_vf32 e = 1.0f - nf_vexpf(NF_ERF_R(nf_vclampf(t, 0.0f, 4.0f) - 2.5f));
    const nf_vf32 far = (nf_vf32)((nf_vi32)e | ((nf_vi32)x & (nf_vi32)nf_vbc_f32(-0.0f)));
    return nf_vsel_f32(t <= 1.0f, x * NF_ERF_P(x * x), far);
}
/* nf_logf lane by lane: the same bit arithmetic (unsigned, so no lane overflows) and selects. */
static inline nf_vf32 nf_vlogf(nf_vf32 x) {
    const nf_vi32 tiny = x < 1.17549435e-38f;
    const nf_vu32 b = (nf_vu32)nf_vsel_f32(tiny, x * 8388608.0f, x);
    const nf_vi32 e = (nf_vi32)(b - 0x3f3504f3u) >> 23;
    const nf_vf32 f = (nf_vf32)(b - ((nf_vu32)e << 23)) - 1.0f;
    const nf_vf32 n = __builtin_convertvector(e, nf_vf32) - (nf_vf32)((nf_vi32)nf_vbc_f32(23.0f) & tiny);
    const nf_vf32 r = NF_LOG_M(f, n);
    const nf_vf32 big = nf_vsel_f32(x == INFINITY, x, r);
    return nf_vsel_f32(x == 0.0f, nf_vbc_f32(-INFINITY), nf_vsel_f32(x > 0.0f, big, nf_vbc_f32(NAN)));
}
static inline nf_vf32 nf_vtanhf(nf_vf32 x) {
    const nf_vf32 c = nf_vclampf(x, -9.0f, 9.0f);
    const nf_vf32 s = c * c;
    return c * NF_TANH_P(s) / NF_TANH_Q(s);
}
static inline void* nf_alloc(int64_t bytes) { void* p = NULL; if (posix_memalign(&p, 64, (size_t)(bytes > 0 ? bytes : 64))) return NULL; return p; }
