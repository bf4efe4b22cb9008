/* The decode step's kernels on an AVX2 CPU (pipeline/row_step.py calls them; the maths is the model's):
     panel_linear   y [M, N] = x [M, K] @ W.T (+ b), for 1 to 64 rows, W packed once by `pack`; the same in
                    bf16 and int8 weight-only (panel_linear_bf16, _i8) for page 12's lower-precision lesson;
     paged_attend   one decode token's attention per row, over its KV blocks where they lie;
     rms_norm, silu_mul   the step's two elementwise stages, one call each;
     greedy_summary the argmax, log-sum-exp and top k of logits rows (a greedy step's choice and its probabilities);
     row_layer      a whole Llama-family decoder layer for any number of rows in one call (the above, one OpenMP region);
     row_layers     every layer (and the final norm and LM head) in one region; row_steps: several greedy decode
                    steps of it in one call (the engine's EngineConfig.decode_steps);
     read_sum       the read probe (pipeline.decode_step.cpu.bandwidth): the limit the products are held against.

   Built by pipeline/decode_step/cpu/native_build.py, loaded by pipeline/decode_step/cpu/matmul.py (gcc -O3 -mavx2 -mfma -fopenmp, once per machine, into the cache,
   loaded only when its digest matches the one recorded at build time: pipeline/trusted.py). These functions trust
   their arguments: every call goes through matmul.py's checked wrappers, which validate shapes, dtypes,
   contiguity, alignment and index ranges in Python first.
   Why it exists: at 2-64 rows no library kernel on the project's build machine streamed the weights anywhere near
   the memory's speed (every SmolLM2 weight at 8 rows: oneDNN packed 74-91 ms, OpenBLAS 81-93, MKL 155, where
   reading them takes ~30-45 ms, depending on the hour); panel_linear runs 1 row as fast as OpenBLAS's sgemv,
   8 rows in about the time of 1, and 32 rows at the speed of a large MKL GEMM (the table in pipeline/decode_step/cpu/matmul.py).

   How: W is copied once into panels of 16 outputs stored k by k (`pack`), so a thread reads its panels forward
   (one row: four panels side by side, four streams, k1x4_f32), each 64-byte line once, and every multiply-add of a
   panel's line is done before the next:
   for each k, the 16 weights W[n0:n0+16, k] (two AVX registers) times x[m, k] (broadcast), added into
   2 x MR accumulators, MR <= 6 rows at a time (12 accumulators + 2 weights + 1 broadcast = 15 of the 16 AVX
   registers). Each output is one sum over k in order 0, 1, ..., K-1 with fused multiply-adds: the same numbers
   whatever M is, whichever chunk of rows and whichever thread computes it. So a request's row gives the same
   logits alone or with 31 others, bit for bit (tests/pipeline/test_row_step.py). */

#include <immintrin.h>
#include <omp.h>
#include <stddef.h>

#define NB 16          /* outputs per panel */
#define PF_BYTES 8192  /* prefetch distance: 8 KB ahead in the panel's stream */

/* W [N, K] -> P [ceil(N/16)][K][16]: each panel of 16 outputs stored k by k (zeros past N); fp32, and for page
   12's lower-precision lesson int8 (weight-only, a scale per output row) and bf16 (the top 16 bits of an fp32) */
#define DEFINE_PACK(NAME, T)                                                              \
    void NAME(const T *w, T *p, int N, int K) {                                           \
        int panels = (N + NB - 1) / NB;                                                   \
        for (int q = 0; q < panels; q++) {                                                \
            T *dst = p + (size_t)q * K * NB;                                              \
            for (int k = 0; k < K; k++)                                                   \
                for (int j = 0; j < NB; j++) {                                            \
                    int n = q * NB + j;                                                   \
                    dst[(size_t)k * NB + j] = n < N ? w[(size_t)n * K + k] : (T)0;        \
                }                                                                         \
        }                                                                                 \
    }
DEFINE_PACK(pack, float)
DEFINE_PACK(pack_i8, signed char)
DEFINE_PACK(pack_u16, unsigned short)

static inline void put(float *y, int n0, int nn, const float *sc, const float *b, __m256 lo, __m256 hi) {
    float t[NB];
    _mm256_storeu_ps(t, lo);
    _mm256_storeu_ps(t + 8, hi);
    for (int j = 0; j < nn; j++) {
        float v = t[j];
        if (sc) v *= sc[n0 + j];
        if (b) v += b[n0 + j];
        y[n0 + j] = v;
    }
}

/* one k of a panel as 16 fp32 weights in w0, w1 (int8 and bf16 widened on the fly), and a prefetch per line */
#define LOAD_f32                                                                          \
    const float *w = pp + (size_t)k * NB;                                                 \
    __m256 w0 = _mm256_load_ps(w);                                                        \
    __m256 w1 = _mm256_load_ps(w + 8);                                                    \
    _mm_prefetch((const char *)w + PF_BYTES, _MM_HINT_T0);
#define LOAD_i8                                                                           \
    const signed char *w = pp + (size_t)k * NB;                                           \
    __m128i q8 = _mm_loadu_si128((const __m128i *)w);                                     \
    __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));                             \
    __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q8, 8)));          \
    if (!(k & 3)) _mm_prefetch((const char *)w + PF_BYTES, _MM_HINT_T0);
#define LOAD_bf16                                                                         \
    const unsigned short *w = pp + (size_t)k * NB;                                        \
    __m256i h16 = _mm256_loadu_si256((const __m256i *)w);                                 \
    __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h16)), 16)); \
    __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h16, 1)), 16)); \
    if (!(k & 1)) _mm_prefetch((const char *)w + PF_BYTES, _MM_HINT_T0);

/* MR rows of x against one panel; written out per MR so that the accumulators stay in registers */
#define ROW_DECL(i) __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps(); const float *x##i = x + (size_t)(i) * K;
#define ROW_FMA(i) { __m256 xb = _mm256_broadcast_ss(x##i + k); a##i##0 = _mm256_fmadd_ps(xb, w0, a##i##0); a##i##1 = _mm256_fmadd_ps(xb, w1, a##i##1); }
#define ROW_PUT(i) put(y + (size_t)(i) * N, n0, nn, sc, b, a##i##0, a##i##1);
#define LOOP(SFX, BODY) for (int k = 0; k < K; k++) { LOAD_##SFX BODY }
#define ARGS(T) const float *x, int K, const T *pp, float *y, int N, int n0, int nn, const float *sc, const float *b
#define R1 ROW_FMA(0)
#define R2 R1 ROW_FMA(1)
#define R3 R2 ROW_FMA(2)
#define R4 R3 ROW_FMA(3)
#define R5 R4 ROW_FMA(4)
#define R6 R5 ROW_FMA(5)
#define D1 ROW_DECL(0)
#define D2 D1 ROW_DECL(1)
#define D3 D2 ROW_DECL(2)
#define D4 D3 ROW_DECL(3)
#define D5 D4 ROW_DECL(4)
#define D6 D5 ROW_DECL(5)
#define P1 ROW_PUT(0)
#define P2 P1 ROW_PUT(1)
#define P3 P2 ROW_PUT(2)
#define P4 P3 ROW_PUT(3)
#define P5 P4 ROW_PUT(4)
#define P6 P5 ROW_PUT(5)

/* y = x @ W.T (* scale) (+ b) with W packed; the panels split evenly over `threads` OpenMP threads (the process's
   one OpenMP pool: torch's libgomp, loaded first, answers to the same name). Rows go in balanced chunks of at most
   6 (8 rows: 4 + 4), each chunk re-reading the panel from the core's cache, not from memory. */
#define KERNELS_FOR(SFX, T)                                                                          \
    static void k1_##SFX(ARGS(T)) { D1 LOOP(SFX, R1) P1 }                                            \
    static void k2_##SFX(ARGS(T)) { D2 LOOP(SFX, R2) P2 }                                            \
    static void k3_##SFX(ARGS(T)) { D3 LOOP(SFX, R3) P3 }                                            \
    static void k4_##SFX(ARGS(T)) { D4 LOOP(SFX, R4) P4 }                                            \
    static void k5_##SFX(ARGS(T)) { D5 LOOP(SFX, R5) P5 }                                            \
    static void k6_##SFX(ARGS(T)) { D6 LOOP(SFX, R6) P6 }                                            \
    typedef void (*kernel_##SFX)(ARGS(T));                                                           \
    static const kernel_##SFX KS_##SFX[7] = {0, k1_##SFX, k2_##SFX, k3_##SFX, k4_##SFX, k5_##SFX, k6_##SFX};
#define LINEAR_FOR(SFX, T)                                                                           \
    static void linear_##SFX(const float *x, const T *p, const float *sc, const float *b, float *y,   \
                             int M, int N, int K, int threads) {                                     \
        int panels = (N + NB - 1) / NB, chunks = (M + 5) / 6;                                        \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                            \
        for (int q = 0; q < panels; q++) {                                                           \
            int n0 = q * NB, nn = N - n0 < NB ? N - n0 : NB;                                         \
            const T *pp = p + (size_t)q * K * NB;                                                    \
            for (int c = 0, m0 = 0; c < chunks; c++) {                                               \
                int left = M - m0, mm = (left + chunks - c - 1) / (chunks - c);                      \
                KS_##SFX[mm](x + (size_t)m0 * K, K, pp, y + (size_t)m0 * N, N, n0, nn, sc, b);       \
                m0 += mm;                                                                            \
            }                                                                                        \
        }                                                                                            \
    }
KERNELS_FOR(f32, float)
KERNELS_FOR(i8, signed char)
KERNELS_FOR(bf16, unsigned short)
LINEAR_FOR(bf16, unsigned short)

/* The calling thread's part of a product's panels among the team's (inside a parallel region). One row: units of four
   panels read side by side (k1x4_f32's four streams), unit u being panels u, Q + u, 2Q + u and 3Q + u of the product's
   first 4Q (its four quarters), so that a thread taking units u, u + 1, ... reads four long forward streams. Each thread
   owns a contiguous range of units and takes them front first from its range's counter; done, it takes what is left
   of the others' ranges from the same counters (a thread the memory serves faster finishes the product's tail); then
   the panels past 4Q (at most 3: Q = panels / 4) go one at a time from the shared counter `grab`, thread t's first
   being 4Q + t. Several rows: one panel a unit, from `grab`. Measured (2026-12-04, one region reading SmolLM2's 121
   products back to back, pure loads, against the read probe): units of four ADJACENT panels handed out one by one read
   0.97 of the probe in a normal minute and 0.82 in a fast one (the probe at ~57 GB/s); these ranges 0.99 and 0.92;
   fixed quarters of each thread's half 0.99 and 0.88 (and they kept one thread waiting at every product's end: 0.5-0.7
   ms a one-row step). Until 2026-12-05 the last 4n-4n+3 panels went one at a time, single streams, to even out the
   threads' ends: 8 of o's and down's 36 panels, 12% of a layer's bytes, read at a fraction of the memory's speed in a
   fast minute. Without them (2026-12-05, one request in the engine, paired with the other way in one process, the
   probe at ~8 ms): the products read 0.92 of the probe where they read 0.83, one request decodes 6% faster (median of
   64 pairs; share 0.79 -> 0.84), and splitting each range's last two units into halves (two streams) to even out the
   ends more finely changed nothing measurable (0.816 against 0.82 in fast minutes).
   Which thread computes a unit changes no bit (each output is the same sums in the same order).
   Counters: each thread leaves each range's loop (and grab's) on exactly one failed claim, so at the product's end
   range r's counter stands at its start + its units + n and grab's at its start + the single panels: every thread
   keeps those starts in `base` (base[0] grab's, base[1 + r] range r's), the same values in all. */
#define TEAM_MAX 64 /* threads the ranges serve; more: one panel a unit from grab */
typedef struct { int count, sense, sleepers; long grab; long rc[TEAM_MAX][8]; } team; /* rc[r][0]: range r's counter */
static inline int quads(int M, int panels, int n) { return M == 1 && n <= TEAM_MAX && panels >= 8 * n ? panels / 4 : 0; }

/* One row against four panels at once: four forward streams for the core to read ahead in, where one stream kept too
   few reads in flight. Measured (a C harness, 2026-12-04, SmolLM2's 120 layer products for one row, best of 8 passes,
   interleaved with the read probe): one panel at a time read 0.82-0.87 of a one-stream probe, two at once 0.91-0.97,
   four at once 0.98-1.16 (47.9 GB/s where the probe read 44.3 in a fast minute). Each output is the same fused
   multiply-adds in the same order as k1_f32's (and as row 0's in any k2..k6): the same bits whichever kernel ran it. */
/* Panels [lo, hi) of y [M, N] = x [M, K] @ W.T (+ b), by the calling thread; with `add`, each panel's outputs also
   added into add [M, N]. One row: four streams (k1x4_f32) over the span's four quarters; several: each panel once,
   its rows in balanced chunks of at most 6 (8 rows: 4 + 4), each chunk re-reading the panel from the core's cache.
   Written once for each weight type (SPAN_FOR): fp32 panels, and int8 panels widened to fp32 in registers with a scale
   per output row (`sc`, applied to each finished sum as put() does for panel_linear_i8: the engine's int8 model, issue
   49), the same sums in the same order whichever; sc is NULL for fp32. */
#define S4_ACC(T, i) __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps(); const T *w##i = p##i;
#define S4_W_f32(i) __m256 v##i##0 = _mm256_load_ps(w##i + (size_t)k * NB), v##i##1 = _mm256_load_ps(w##i + (size_t)k * NB + 8);
#define S4_W_i8(i) __m128i q##i = _mm_loadu_si128((const __m128i *)(w##i + (size_t)k * NB));                          \
                   __m256 v##i##0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q##i));                                   \
                   __m256 v##i##1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q##i, 8)));
#define S4_FMA(i) a##i##0 = _mm256_fmadd_ps(xb, v##i##0, a##i##0); a##i##1 = _mm256_fmadd_ps(xb, v##i##1, a##i##1);
#define S4_PUT(i) put(y, n0[i], N - n0[i] < NB ? N - n0[i] : NB, sc, b, a##i##0, a##i##1);
#define SPAN_FOR(SFX, T)                                                                                                   \
static void k1x4_##SFX(const float *x, int K, const T *p0, const T *p1, const T *p2, const T *p3, float *y, int N,       \
                       const int *n0, const float *sc, const float *b) {                                                 \
    S4_ACC(T, 0) S4_ACC(T, 1) S4_ACC(T, 2) S4_ACC(T, 3)                                                                  \
    for (int k = 0; k < K; k++) {                                                                                        \
        __m256 xb = _mm256_broadcast_ss(x + k);                                                                          \
        S4_W_##SFX(0) S4_FMA(0) S4_W_##SFX(1) S4_FMA(1) S4_W_##SFX(2) S4_FMA(2) S4_W_##SFX(3) S4_FMA(3)                  \
    }                                                                                                                    \
    S4_PUT(0) S4_PUT(1) S4_PUT(2) S4_PUT(3)                                                                              \
}                                                                                                                        \
static void panel_span_##SFX(const float *x, const T *p, const float *sc, const float *b, float *y, int M, int N, int K, \
                             int lo, int hi, float *add) {                                                              \
    int q = lo, chunks = (M + 5) / 6;                                                                                    \
    if (M == 1) {                                                                                                        \
        int qu = (hi - lo) / 4;                                                                                          \
        for (; q < lo + qu; q++) {                                                                                       \
            int n0[4] = {q * NB, (q + qu) * NB, (q + 2 * qu) * NB, (q + 3 * qu) * NB};                                   \
            k1x4_##SFX(x, K, p + (size_t)n0[0] * K, p + (size_t)n0[1] * K, p + (size_t)n0[2] * K, p + (size_t)n0[3] * K, \
                       y, N, n0, sc, b);                                                                                 \
        }                                                                                                                \
        if (add)                                                                                                         \
            for (int j = 0; j < 4 * qu * NB && lo * NB + j < N; j++) add[lo * NB + j] += y[lo * NB + j];                 \
        q = lo + 4 * qu;                                                                                                 \
    }                                                                                                                    \
    for (; q < hi; q++) {                                                                                                \
        int n0 = q * NB, nn = N - n0 < NB ? N - n0 : NB;                                                                 \
        const T *pp = p + (size_t)q * K * NB;                                                                            \
        for (int c = 0, m0 = 0; c < chunks; c++) {                                                                       \
            int left = M - m0, mm = (left + chunks - c - 1) / (chunks - c);                                              \
            KS_##SFX[mm](x + (size_t)m0 * K, K, pp, y + (size_t)m0 * N, N, n0, nn, sc, b);                               \
            m0 += mm;                                                                                                    \
        }                                                                                                                \
        if (add)                                                                                                         \
            for (int m = 0; m < M; m++)                                                                                  \
                for (int j = 0; j < nn; j++) add[(size_t)m * N + n0 + j] += y[(size_t)m * N + n0 + j];                   \
    }                                                                                                                    \
}                                                                                                                        \
static void quad_unit_##SFX(const float *x, const T *p, const float *sc, const float *b, float *y, int N, int K, long q, \
                            int Q, float *add) {                                                                         \
    int n0[4] = {(int)q * NB, (int)(q + Q) * NB, (int)(q + 2 * Q) * NB, (int)(q + 3 * Q) * NB};                          \
    k1x4_##SFX(x, K, p + (size_t)n0[0] * K, p + (size_t)n0[1] * K, p + (size_t)n0[2] * K, p + (size_t)n0[3] * K, y, N,  \
               n0, sc, b);                                                                                               \
    if (add)                                                                                                             \
        for (int j = 0; j < 4; j++)                                                                                      \
            for (int i = 0; i < NB && n0[j] + i < N; i++) add[n0[j] + i] += y[n0[j] + i];                                \
}                                                                                                                        \
static void panels_for_##SFX(const float *x, const T *p, const float *sc, const float *b, float *y, int M, int N, int K, \
                             float *add, team *t, long *base) {                                                          \
    int n = omp_get_num_threads(), me = omp_get_thread_num(), panels = (N + NB - 1) / NB, Q = quads(M, panels, n);       \
    if (Q) {                                                                                                             \
        for (int v = 0; v < n; v++) {                                                                                    \
            int r = (me + v) % n;                                                                                        \
            long lo = (long)Q * r / n, size = (long)Q * (r + 1) / n - lo, b0 = base[1 + r], u;                           \
            while ((u = __atomic_fetch_add(&t->rc[r][0], 1, __ATOMIC_RELAXED) - b0) < size)                              \
                quad_unit_##SFX(x, p, sc, b, y, N, K, lo + u, Q, add);                                                   \
        }                                                                                                                \
        for (int r = 0; r < n; r++) base[1 + r] += (long)Q * (r + 1) / n - (long)Q * r / n + n;                          \
    }                                                                                                                    \
    long singles = panels - 4L * Q, b0 = base[0];                                                                        \
    for (long u = me; u < singles; u = n + __atomic_fetch_add(&t->grab, 1, __ATOMIC_RELAXED) - b0)                       \
        panel_span_##SFX(x, p, sc, b, y, M, N, K, (int)(4 * Q + u), (int)(4 * Q + u + 1), add);                          \
    base[0] = b0 + singles;                                                                                              \
}
SPAN_FOR(f32, float)
SPAN_FOR(i8, signed char)
/* a product's panels in the team: int8 panels with their scales where sc is given, else fp32 */
static void panels_for(const float *x, const void *p, const float *sc, const float *b, float *y, int M, int N, int K,
                       float *add, team *t, long *base) {
    if (sc) panels_for_i8(x, (const signed char *)p, sc, b, y, M, N, K, add, t, base);
    else panels_for_f32(x, (const float *)p, 0, b, y, M, N, K, add, t, base);
}

void panel_linear(const float *x, const float *p, const float *b, float *y, int M, int N, int K, int threads) {
    team t = {0};
    #pragma omp parallel num_threads(threads)
    {
        long base[1 + TEAM_MAX] = {0};
        panels_for(x, p, 0, b, y, M, N, K, 0, &t, base);
    }
}
void panel_linear_i8(const float *x, const signed char *p, const float *scale, const float *b, float *y, int M, int N, int K, int threads) {
    team t = {0};
    #pragma omp parallel num_threads(threads)
    {
        long base[1 + TEAM_MAX] = {0};
        panels_for(x, p, scale, b, y, M, N, K, 0, &t, base);
    }
}
void panel_linear_bf16(const float *x, const unsigned short *p, const float *b, float *y, int M, int N, int K, int threads) {
    linear_bf16(x, p, 0, b, y, M, N, K, threads);
}

/* ------------------------------------------------------------------------------------------------------------
   Decode attention over paged keys and values, read where they lie (no gather, no padding, no mask).

   For row b (one decode token of one request) and each of its KV heads: the G query heads that share the KV
   head score every position p in [lo[b], hi[b]) (its window), s = scale * q . K[p]; softmax over those
   positions (minus their largest score, then exp, then / the sum); out = sum_p softmax(p) V[p]. Position p
   lies in block tables[b * max_blocks + p / bs], slot p % bs; a block's keys for one KV head start at
   K + block * s_blk + kv * s_kv, one position every s_pos floats, its D values contiguous. A static buffer
   [KV, max_len, D] is one block of bs = max_len. The (row, KV head) pairs split over the threads; each pair's
   numbers are computed the same way whatever else is in the call. */

#include <math.h>
#include <stdlib.h>

static inline float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s = _mm_add_ps(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)));
}

/* e^x for 8 floats (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, 2^n in the exponent bits; within
   2 ulp of expf; x clamped to [-87, 88], where e^x is still a normal float) */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float dot(const float *a, const float *b, int D) {
    __m256 acc = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    float s = hsum(acc);
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* walks positions p0, p0 + 1, ... of one KV head: the pointer to each one's D values, a block at a time */
typedef struct { const float *base; const int *table; long s_blk, s_pos; int blk, off, bs; } walk;
static inline walk walk_at(const float *base, const int *table, long s_blk, long s_kv, long s_pos, int kv, int p, int bs) {
    walk w = {base + kv * s_kv, table, s_blk, s_pos, p / bs, p % bs, bs};
    return w;
}
static inline const float *walk_next(walk *w) {
    const float *r = w->base + w->table[w->blk] * w->s_blk + w->off * w->s_pos;
    if (++w->off == w->bs) { w->off = 0; w->blk++; }
    return r;
}

/* one (row, KV head) task of paged_attend: the G query heads qb [G, D] of row b over positions [p0, p0 + n) */
static void attend_task(const float *qb, const float *K, const float *V, long s_blk, long s_kv, long s_pos,
                        const int *table, int p0, int n, int kv, int G, int D, int bs, float scale, float *ob,
                        int *failed) {
        int ns = (n + 7) & ~7; /* each query head's scores padded to whole vectors for exp8 */
        float *s = malloc(sizeof(float) * (size_t)G * (ns > 0 ? ns : 8));
        if (s == NULL) {
            for (size_t j = 0; j < (size_t)G * D; j++) ob[j] = NAN;
            #pragma omp atomic write
            *failed = 1;
            return;
        }
        /* scores: two positions at a time (independent sums for the processor to overlap) */
        walk wk = walk_at(K, table, s_blk, s_kv, s_pos, kv, p0, bs);
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            const float *k0 = walk_next(&wk), *k1 = walk_next(&wk);
            for (int g = 0; g < G; g++) {
                const float *qg = qb + (size_t)g * D;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                int d = 0;
                for (; d + 8 <= D; d += 8) {
                    __m256 qv = _mm256_loadu_ps(qg + d);
                    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
                    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
                }
                float d0 = hsum(a0), d1 = hsum(a1);
                for (; d < D; d++) { d0 += qg[d] * k0[d]; d1 += qg[d] * k1[d]; }
                s[(size_t)g * ns + i] = scale * d0;
                s[(size_t)g * ns + i + 1] = scale * d1;
            }
        }
        for (; i < n; i++) {
            const float *k0 = walk_next(&wk);
            for (int g = 0; g < G; g++) s[(size_t)g * ns + i] = scale * dot(qb + (size_t)g * D, k0, D);
        }
        for (int g = 0; g < G; g++) {
            float *sg = s + (size_t)g * ns, m = -INFINITY, sum = 0.0f;
            for (int j = 0; j < n; j++) m = sg[j] > m ? sg[j] : m;
            for (int j = n; j < ns; j++) sg[j] = m;
            for (int j = 0; j < ns; j += 8) _mm256_storeu_ps(sg + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + j), _mm256_set1_ps(m))));
            for (int j = 0; j < n; j++) sum += sg[j];
            float inv = 1.0f / sum;
            for (int j = 0; j < n; j++) sg[j] *= inv;
        }
        /* out[g] = sum_p softmax[g][p] V[p], 64 of the D values at a time in 8 registers */
        for (int g = 0; g < G; g++) {
            const float *sg = s + (size_t)g * ns;
            float *o = ob + (size_t)g * D;
            int d0 = 0;
            for (; d0 + 64 <= D; d0 += 64) {
                __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
                __m256 c4 = _mm256_setzero_ps(), c5 = _mm256_setzero_ps(), c6 = _mm256_setzero_ps(), c7 = _mm256_setzero_ps();
                walk wv = walk_at(V, table, s_blk, s_kv, s_pos, kv, p0, bs);
                for (int j = 0; j < n; j++) {
                    const float *v = walk_next(&wv) + d0;
                    __m256 w = _mm256_set1_ps(sg[j]);
                    c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), c0);
                    c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), c1);
                    c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), c2);
                    c3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), c3);
                    c4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), c4);
                    c5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), c5);
                    c6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), c6);
                    c7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), c7);
                }
                _mm256_storeu_ps(o + d0, c0); _mm256_storeu_ps(o + d0 + 8, c1);
                _mm256_storeu_ps(o + d0 + 16, c2); _mm256_storeu_ps(o + d0 + 24, c3);
                _mm256_storeu_ps(o + d0 + 32, c4); _mm256_storeu_ps(o + d0 + 40, c5);
                _mm256_storeu_ps(o + d0 + 48, c6); _mm256_storeu_ps(o + d0 + 56, c7);
            }
            for (; d0 < D; d0++) {
                float acc = 0.0f;
                walk wv = walk_at(V, table, s_blk, s_kv, s_pos, kv, p0, bs);
                for (int j = 0; j < n; j++) acc += sg[j] * walk_next(&wv)[d0];
                o[d0] = acc;
            }
        }
        free(s);
}

void paged_attend(const float *q, const float *K, const float *V, long s_blk, long s_kv, long s_pos,
                  const int *tables, int max_blocks, const int *lo, const int *hi, int B, int KV, int G, int D,
                  int bs, float scale, float *out, int threads, int *failed) {
    /* failed: set to 1 when a row's score buffer could not be allocated (that row's output is then NaN); the
       caller (pipeline/decode_step/cpu/matmul.py) raises MemoryError. Shapes, strides and tables are checked there first. */
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int task = 0; task < B * KV; task++) {
        int b = task / KV, kv = task % KV;
        attend_task(q + ((size_t)b * KV + kv) * G * D, K, V, s_blk, s_kv, s_pos, tables + (size_t)b * max_blocks,
                    lo[b], hi[b] - lo[b], kv, G, D, bs, scale, out + ((size_t)b * KV + kv) * G * D, failed);
    }
}

/* ------------------------------------------------------------------------------------------------------------
   The step's two small elementwise stages, one call each instead of ~6 numpy operations (measured 2026-12-03 for
   one 576-wide row: numpy's six operations 11.4 µs, this function through the checked Python call 6.8 µs, most of
   it the call and its checks).

   rms_norm: y[m] = x[m] / sqrt(mean(x[m]^2) + eps) * scale (scale = the module's weight, or 1 + weight for
   Gemma: the caller passes it ready). silu_mul: y = g / (1 + e^-g) * u, the SwiGLU MLP's middle. */

void rms_norm(const float *x, const float *scale, float *y, int M, int D, float eps) {
    for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * D;
        float *ym = y + (size_t)m * D;
        float ss = dot(xm, xm, D);
        float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (int d = 0; d < D; d++) ym[d] = xm[d] * r * scale[d];
    }
}

void silu_mul(const float *g, const float *u, float *y, int M, int N, int ldg) {
    /* g, u: rows of N values, ldg floats apart (the two halves of the fused gate/up product); y [M, N] */
    for (int m = 0; m < M; m++) {
        const float *gm = g + (size_t)m * ldg, *um = u + (size_t)m * ldg;
        float *ym = y + (size_t)m * N;
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            __m256 gv = _mm256_loadu_ps(gm + n);
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(ym + n, _mm256_mul_ps(s, _mm256_loadu_ps(um + n)));
        }
        for (; n < N; n++) ym[n] = gm[n] / (1.0f + expf(-gm[n])) * um[n];
    }
}

/* greedy_summary: what a greedy step needs of each logits row [V] (pipeline.forward.sampling.GreedySummary, on a CPU):
   its argmax (the first of equal largest), its log-sum-exp (the largest + log of the sum of e^(x - largest): 8 lanes
   of floats, then added in double) and its k largest values with their ids, largest first (equal values: the lower id
   first). One thread, one pass for the largest and the top k, one for the sum: torch's three reductions over a
   49,152-wide row each woke the process's OpenMP team (0.6 ms a token in the engine, measured; ~60 us here). */
void greedy_summary(const float *x, int rows, int V, int k, long long *argmax, float *lse, float *vals, long long *ids) {
    for (int r = 0; r < rows; r++, x += V, vals += k, ids += k) {
        int got = 0, at = 0;
        for (int i = 0; i < V; i++) {
            float v = x[i];
            if (v > x[at]) at = i;
            if (got < k || v > vals[k - 1]) {
                int j = got < k ? got++ : k - 1;
                for (; j > 0 && vals[j - 1] < v; j--) { vals[j] = vals[j - 1]; ids[j] = ids[j - 1]; }
                vals[j] = v;
                ids[j] = i;
            }
        }
        float top = x[at];
        __m256 acc = _mm256_setzero_ps(), t = _mm256_set1_ps(top);
        int i = 0;
        for (; i + 8 <= V; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), t)));
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        double sum = 0;
        for (int j = 0; j < 8; j++) sum += lanes[j];
        for (; i < V; i++) sum += expf(x[i] - top);
        argmax[r] = at;
        lse[r] = top + (float)log(sum);
    }
}

/* read_sum: the sum of n floats, each read once, with AVX2 loads: the range split in `threads` contiguous shares
   (OpenMP), each thread reading its share as four forward streams at once (its four quarters side by side, an
   accumulator each): a STREAM-style read, the most a decode step's weight reads can reach on this machine
   (pipeline.decode_step.cpu.bandwidth times it over a buffer as large as a model's weights). Four streams, because one stream a
   thread (this probe until 2026-12-04) read 13-17% less on this project's machines, measured interleaved: the limit
   is what the memory gives to the best reader we can write, and the products read that way too (k1x4_f32). The sum
   is returned so the reads cannot be optimised away. */
double read_sum(const float *a, long n, int threads) {
    double total = 0.0;
    #pragma omp parallel num_threads(threads) reduction(+:total)
    {
        long t = omp_get_thread_num(), T = omp_get_num_threads();
        long lo = n * t / T, hi = n * (t + 1) / T, q = (hi - lo) / 32 * 8; /* each stream: q floats, a multiple of 8 */
        const float *s0 = a + lo, *s1 = s0 + q, *s2 = s1 + q, *s3 = s2 + q;
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        for (long i = 0; i < q; i += 8) {
            c0 = _mm256_add_ps(c0, _mm256_loadu_ps(s0 + i));
            c1 = _mm256_add_ps(c1, _mm256_loadu_ps(s1 + i));
            c2 = _mm256_add_ps(c2, _mm256_loadu_ps(s2 + i));
            c3 = _mm256_add_ps(c3, _mm256_loadu_ps(s3 + i));
        }
        float rest = hsum(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
        for (long i = lo + 4 * q; i < hi; i++) rest += a[i];
        total += rest;
    }
    return total;
}

/* ------------------------------------------------------------------------------------------------------------
   A whole decoder layer of the Llama family for M rows in one call and one OpenMP parallel region (pipeline/decode_step/
   row_step.py's `_RowLayer.native` where the layer has no other norms and a SiLU MLP: SmolLM2, Llama, Qwen2):

       h = rms_norm(x) * n_in;  qkv = h @ Wqkv.T (+ b);  RoPE on q and k;  K[pos], V[pos] = k, v;
       a = attention over the row's blocks [lo, hi);  x += a @ Wo.T (+ b);
       h = rms_norm(x) * n_mid;  gu = h @ Wgu.T (+ b);  x += (silu(g) * u) @ Wdown.T (+ b)

   The same kernels as the step's separate calls (the panel kernel, rms_norm, silu_mul, attend_task), so a row's
   numbers still do not depend on what shares its pass; what the one call saves is what lay between the products:
   ~15 Python calls a layer (checks, new arrays, the threads handed work each time) and numpy's small operations,
   during which nothing read the weights (the measured split is in row_step.py's docstring). The phases are
   worksharing loops of the one team, each ending at team_wait_pf (below): norm (rows), QKV (panels), RoPE and the K/V
   write (rows), attention (row x KV head), output product and residual (panels), norm, gate/up (panels), SiLU (rows),
   down product and residual (panels).
   ws: M * (d + (H + 2 KV) D + H D + 3 I + d) floats of workspace. */

/* The team's meeting point between the layer's phases, instead of OpenMP's barrier. On this project's machines (virtual
   CPUs) a thread that waits in libgomp's barrier for longer than a short spin sleeps, and the wake-up costs 20-60 us:
   measured per thread inside row_layer (one row, SmolLM2), the two threads spent 7-8 ms of a 30 ms step waiting at the
   9 barriers a layer, where their products read at the memory's full speed. Here a waiting thread keeps checking
   (a load, no `pause`, which virtual machines may trap) for longer than a quiet step's waits, and only then sleeps
   (a futex the last arrival wakes): when another process keeps the cores busy the thread waited for may be
   descheduled, and spinning on (or yielding: measured, steps of 600 ms) would take the processor from it.
   While it checks, a waiting thread prefetches [pf, pe) a line a check: its first unit of the next product
   (panels_for, FIRST), so the time it waits reads what it will need. Sense-reversing; `t` lives on the caller's
   stack, so concurrent calls (two sessions' passes) each have their own.
   Memory order: the last arrival's store publishes every thread's writes of the phase to the threads that acquire
   it; the sleepers count and the flag are sequentially consistent, so a sleeper is always woken or never sleeps. */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TEAM_SPIN 50000 /* checks before sleeping: ~50-100 us, longer than the waits of a quiet step */
/* what a waiting thread prefetches: `lines` cache lines from `at`, over four streams `stride` bytes apart (a unit of
   four panels) or one (stride 0) */
typedef struct { const char *at; long stride, lines; } ahead;
static inline void team_wait_pf(team *t, int n, int *sense, ahead a) {
    int s = *sense = !*sense;
    if (__atomic_add_fetch(&t->count, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&t->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->sense, s, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, &t->sense, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    for (long i = 0; i < TEAM_SPIN; i++) {
        if (__atomic_load_n(&t->sense, __ATOMIC_ACQUIRE) == s) return;
        if (i < a.lines) _mm_prefetch(a.at + (a.stride ? (i & 3) * a.stride + (i >> 2) * 64 : i * 64), _MM_HINT_T0);
    }
    __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST); /* then the last arrival wakes us (or we see its flag) */
    while (__atomic_load_n(&t->sense, __ATOMIC_SEQ_CST) != s)
        syscall(SYS_futex, &t->sense, FUTEX_WAIT_PRIVATE, !s, NULL, NULL, 0);
    __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
}
/* the calling thread's first unit of the product x [M, K] @ W.T, W packed at p with N outputs (panels_for): the first
   unit of its range (four panels), or its first single panel; nothing where it has none */
#define FIRST(p, sc, N, K, M) first_unit(p, sc ? 1 : (int)sizeof(float), N, K, M)
static inline ahead first_unit(const void *p, int es, int N, int K, int M) {
    int panels = (N + NB - 1) / NB, n = omp_get_num_threads(), me = omp_get_thread_num(), Q = quads(M, panels, n);
    long panel = (long)K * NB * es, q = Q ? (long)Q * me / n : 4L * Q + me;
    ahead a = {(const char *)p + q * panel, Q ? Q * panel : 0, 0};
    if (Q ? (long)Q * (me + 1) / n > q : q < panels) a.lines = (Q ? 4 : 1) * panel / 64;
    return a;
}

static void rope_row(float *v, int heads, int D, const float *c, const float *s) {
    /* v [heads, D] in place: v * cos + rotate_half(v) * sin, rotate_half(v) = [-v2, v1] */
    int half = D / 2;
    for (int j = 0; j < heads; j++, v += D)
        for (int e = 0; e < half; e++) {
            float x1 = v[e], x2 = v[e + half];
            v[e] = x1 * c[e] + (-x2) * s[e];
            v[e + half] = x2 * c[e + half] + x1 * s[e + half];
        }
}

/* One layer, run by every thread of the team (inside its parallel region); the phases meet at team_wait_pf. */
static void layer_team(team *t, int n, int *sense, long *base, float *x, int M, int d, int H, int KV, int D, int I,
                       const float *n_in, float eps_in, const float *n_mid, float eps_mid, const void *p_qkv,
                       const float *b_qkv, const void *p_o, const float *b_o, const void *p_gu, const float *b_gu,
                       const void *p_down, const float *b_down, const float *s_qkv, const float *s_o, const float *s_gu,
                       const float *s_down, const float *cosv, const float *sinv, float *K, float *V,
                       long s_blk, long s_kv, long s_pos, const int *blk, const int *off, const int *tables, int mb,
                       const int *lo, const int *hi, int bs, float scale, float *ws, float *own, int *failed) {
    int NQ = (H + 2 * KV) * D, G = H / KV;
    float *h = ws, *qkv = h + (size_t)M * d, *a = qkv + (size_t)M * NQ, *gu = a + (size_t)M * H * D;
    float *act = gu + (size_t)M * 2 * I, *y = act + (size_t)M * I;
    /* one row with `own` (d + I floats a thread): every thread computes the normed row and the SiLU output into its own
       copy (the same function, the same bits) instead of waiting for one thread at a meeting point: 3 of the layer's
       9 meeting points fewer */
    float *hn = own ? own + (size_t)omp_get_thread_num() * (d + I) : h, *an = own ? hn + d : act;
    if (own) {
        rms_norm(x, n_in, hn, 1, d, eps_in);
    } else {
        #pragma omp for schedule(static) nowait
        for (int m = 0; m < M; m++) rms_norm(x + (size_t)m * d, n_in, h + (size_t)m * d, 1, d, eps_in);
        team_wait_pf(t, n, sense, FIRST(p_qkv, s_qkv, NQ, d, M));
    }
    panels_for(hn, p_qkv, s_qkv, b_qkv, qkv, M, NQ, d, 0, t, base);
    team_wait_pf(t, n, sense, FIRST(p_o, s_o, d, H * D, M));
    #pragma omp for schedule(static) nowait
    for (int m = 0; m < M; m++) {
        float *r = qkv + (size_t)m * NQ;
        rope_row(r, H + KV, D, cosv + (size_t)m * D, sinv + (size_t)m * D);
        for (int j = 0; j < KV; j++) {
            size_t at = (size_t)blk[m] * s_blk + (size_t)j * s_kv + (size_t)off[m] * s_pos;
            for (int e = 0; e < D; e++) {
                K[at + e] = r[(size_t)(H + j) * D + e];
                V[at + e] = r[(size_t)(H + KV + j) * D + e];
            }
        }
    }
    team_wait_pf(t, n, sense, FIRST(p_o, s_o, d, H * D, M));
    #pragma omp for schedule(static) nowait
    for (int task = 0; task < M * KV; task++) {
        int m = task / KV, j = task % KV;
        attend_task(qkv + (size_t)m * NQ + (size_t)j * G * D, K, V, s_blk, s_kv, s_pos, tables + (size_t)m * mb,
                    lo[m], hi[m] - lo[m], j, G, D, bs, scale, a + ((size_t)m * KV + j) * G * D, failed);
    }
    team_wait_pf(t, n, sense, FIRST(p_o, s_o, d, H * D, M));
    panels_for(a, p_o, s_o, b_o, y, M, d, H * D, x, t, base);
    team_wait_pf(t, n, sense, FIRST(p_gu, s_gu, 2 * I, d, M));
    if (own) {
        rms_norm(x, n_mid, hn, 1, d, eps_mid);
    } else {
        #pragma omp for schedule(static) nowait
        for (int m = 0; m < M; m++) rms_norm(x + (size_t)m * d, n_mid, h + (size_t)m * d, 1, d, eps_mid);
        team_wait_pf(t, n, sense, FIRST(p_gu, s_gu, 2 * I, d, M));
    }
    panels_for(hn, p_gu, s_gu, b_gu, gu, M, 2 * I, d, 0, t, base);
    team_wait_pf(t, n, sense, FIRST(p_down, s_down, d, I, M));
    if (own) {
        silu_mul(gu, gu + I, an, 1, I, 2 * I);
    } else {
        #pragma omp for schedule(static) nowait
        for (int m = 0; m < M; m++) silu_mul(gu + (size_t)m * 2 * I, gu + (size_t)m * 2 * I + I, act + (size_t)m * I, 1, I, 2 * I);
        team_wait_pf(t, n, sense, FIRST(p_down, s_down, d, I, M));
    }
    panels_for(an, p_down, s_down, b_down, y, M, d, I, x, t, base);
}

void row_layer(float *x, int M, int d, int H, int KV, int D, int I, const float *n_in, float eps_in,
               const float *n_mid, float eps_mid, const void *p_qkv, const float *b_qkv, const void *p_o,
               const float *b_o, const void *p_gu, const float *b_gu, const void *p_down, const float *b_down,
               const float *cosv, const float *sinv, float *K, float *V, long s_blk, long s_kv, long s_pos,
               const int *blk, const int *off, const int *tables, int mb, const int *lo, const int *hi, int bs,
               float scale, float *ws, int threads, int *failed, const float *s_qkv, const float *s_o, const float *s_gu,
               const float *s_down) {
    team t = {0};
    float *own = M == 1 ? malloc(sizeof(float) * (size_t)threads * (d + I)) : NULL; /* NULL: the shared path */
    #pragma omp parallel num_threads(threads)
    {
        int n = omp_get_num_threads(), sense = 0;
        long base[1 + TEAM_MAX] = {0};
        layer_team(&t, n, &sense, base, x, M, d, H, KV, D, I, n_in, eps_in, n_mid, eps_mid, p_qkv, b_qkv, p_o, b_o, p_gu, b_gu,
                   p_down, b_down, s_qkv, s_o, s_gu, s_down, cosv, sinv, K, V, s_blk, s_kv, s_pos, blk, off, tables, mb, lo, hi, bs, scale, ws, own, failed);
    }
    free(own);
}

/* Layers 0 .. L-1 in ONE parallel region (row_step's pass when nothing may interrupt it between layers): the same
   layer_team per layer, so the same numbers as L calls of row_layer, without the team's start and the Python between
   layers (~1 ms and ~1-2 ms a one-row step). Per layer l: its weights from the arrays, its KV memory at
   K + l * kv_layer (floats). With p_head: then the rows keep[0..MK) through the final norm (n_final, eps_final) and the
   LM head (p_head packed, b_head or NULL) into logits [MK, vocab], as panel_linear would compute them, without a second
   region and the Python between (~0.2 ms a one-row step). */
void row_layers(int L, float *x, int M, int d, int H, int KV, int D, int I, const float *const *n_in, const float *eps_in,
                const float *const *n_mid, const float *eps_mid, const void *const *p_qkv, const float *const *b_qkv,
                const void *const *p_o, const float *const *b_o, const void *const *p_gu, const float *const *b_gu,
                const void *const *p_down, const float *const *b_down, const float *cosv, const float *sinv, float *K,
                float *V, long kv_layer, long s_blk, long s_kv, long s_pos, const int *blk, const int *off,
                const int *tables, int mb, const int *lo, const int *hi, int bs, float scale, float *ws, int threads,
                int *failed, const float *n_final, float eps_final, const void *p_head, const float *b_head, int vocab,
                const int *keep, int MK, float *logits, const float *const *s_qkv, const float *const *s_o,
                const float *const *s_gu, const float *const *s_down, const float *s_head) {
    team t = {0};
    float *own = M == 1 ? malloc(sizeof(float) * (size_t)threads * (d + I)) : NULL; /* NULL: the shared path */
    #pragma omp parallel num_threads(threads)
    {
        int n = omp_get_num_threads(), sense = 0;
        long base[1 + TEAM_MAX] = {0};
        for (int l = 0; l < L; l++) {
            const float *sq = s_qkv ? s_qkv[l] : 0, *so = s_o ? s_o[l] : 0, *sg = s_gu ? s_gu[l] : 0, *sd = s_down ? s_down[l] : 0;
            if (l) team_wait_pf(&t, n, &sense, FIRST(p_qkv[l], sq, (H + 2 * KV) * D, d, M)); /* the last phase's residual add into x, done by every thread */
            layer_team(&t, n, &sense, base, x, M, d, H, KV, D, I, n_in[l], eps_in[l], n_mid[l], eps_mid[l], p_qkv[l], b_qkv[l],
                       p_o[l], b_o[l], p_gu[l], b_gu[l], p_down[l], b_down[l], sq, so, sg, sd, cosv, sinv, K + (size_t)l * kv_layer,
                       V + (size_t)l * kv_layer, s_blk, s_kv, s_pos, blk, off, tables, mb, lo, hi, bs, scale, ws, own, failed);
        }
        if (p_head) { /* the final norm of the rows `keep` and the LM head, in the same region */
            team_wait_pf(&t, n, &sense, FIRST(p_head, s_head, vocab, d, MK));
            #pragma omp for schedule(static) nowait
            for (int m = 0; m < MK; m++) rms_norm(x + (size_t)keep[m] * d, n_final, ws + (size_t)m * d, 1, d, eps_final);
            team_wait_pf(&t, n, &sense, FIRST(p_head, s_head, vocab, d, MK));
            panels_for(ws, p_head, s_head, b_head, logits, MK, vocab, d, 0, &t, base);
        }
    }
    free(own);
}

/* ------------------------------------------------------------------------------------------------------------
   Up to `steps` greedy decode tokens for M rows in one call (vLLM's multi-step scheduling: the engine's Python
   between passes, ~1 ms a pass on the project's 2-core machine with the caches the weights' stream has just
   emptied, is paid once for several tokens). Step s, for each row m: its token's embedding (row tok[m] of `table`,
   a plain embedding), RoPE rows of its position pos[m] (cos_all, sin_all [positions, D]), its KV slot from its block
   table, then row_layers (every layer, the final norm and the LM head: the same numbers as a pass of its own), then
   greedy_summary of its logits row into step s's outputs: argmax [steps, M], lse [steps, M], vals, ids
   [steps, M, k]; the argmax is the row's next token, at pos[m] + 1. Stops after the step where a row's token is one
   of its stop ids (stop [M, S], -1 for none), or where a row has made left[m] tokens, or where *flag is non-zero
   (the engine's scheduler sets it when a request arrives or is cancelled): the rows stay in step with each other.
   x, cs: workspace [M, d] and [2, M, D]; blk, off, hi: workspace [M] ints; lo [M] zeros (no sliding window).
   Returns the steps done (>= 1 when steps >= 1); with *failed set, the pass that failed is the last done. */
int row_steps(int steps, const float *table, const float *cos_all, const float *sin_all, long long *tok, int *pos,
              const int *stop, int S, const int *left, const int *flag, int k, long long *argmax, float *lse,
              float *vals, long long *ids, float *cs, int *blk, int *off, int *hi,
              int L, float *x, int M, int d, int H, int KV, int D, int I, const float *const *n_in, const float *eps_in,
              const float *const *n_mid, const float *eps_mid, const void *const *p_qkv, const float *const *b_qkv,
              const void *const *p_o, const float *const *b_o, const void *const *p_gu, const float *const *b_gu,
              const void *const *p_down, const float *const *b_down, float *K, float *V, long kv_layer, long s_blk,
              long s_kv, long s_pos, const int *tables, int mb, const int *lo, int bs, float scale, float *ws,
              int threads, int *failed, const float *n_final, float eps_final, const void *p_head, const float *b_head,
              int vocab, const int *keep, float *logits, const float *const *s_qkv, const float *const *s_o,
              const float *const *s_gu, const float *const *s_down, const float *s_head) {
    float *cosv = cs, *sinv = cs + (size_t)M * D;
    for (int s = 0; s < steps; s++) {
        for (int m = 0; m < M; m++) {
            int p = pos[m];
            const float *e = table + (size_t)tok[m] * d;
            for (int j = 0; j < d; j++) x[(size_t)m * d + j] = e[j];
            for (int j = 0; j < D; j++) {
                cosv[(size_t)m * D + j] = cos_all[(size_t)p * D + j];
                sinv[(size_t)m * D + j] = sin_all[(size_t)p * D + j];
            }
            blk[m] = tables[(size_t)m * mb + p / bs];
            off[m] = p % bs;
            hi[m] = p + 1;
        }
        row_layers(L, x, M, d, H, KV, D, I, n_in, eps_in, n_mid, eps_mid, p_qkv, b_qkv, p_o, b_o, p_gu, b_gu, p_down,
                   b_down, cosv, sinv, K, V, kv_layer, s_blk, s_kv, s_pos, blk, off, tables, mb, lo, hi, bs, scale, ws,
                   threads, failed, n_final, eps_final, p_head, b_head, vocab, keep, M, logits, s_qkv, s_o, s_gu, s_down, s_head);
        greedy_summary(logits, M, vocab, k, argmax + (size_t)s * M, lse + (size_t)s * M, vals + (size_t)s * M * k,
                       ids + (size_t)s * M * k);
        int end = *failed || s + 1 == steps || __atomic_load_n(flag, __ATOMIC_RELAXED);
        for (int m = 0; m < M; m++) {
            long long t = argmax[(size_t)s * M + m];
            for (int j = 0; j < S; j++) end |= stop[(size_t)m * S + j] == t;
            end |= s + 1 >= left[m];
            tok[m] = t;
            pos[m] += 1;
        }
        if (end) return s + 1;
    }
    return steps;
}
