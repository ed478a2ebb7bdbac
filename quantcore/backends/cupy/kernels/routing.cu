// Routing of mixture-of-experts layers: the permute (a stable counting sort of the (token, slot) pairs by
// expert, each token quantized once and written to each of its rows) and the un-permute (the weighted sum
// of a token's rows in slot order). The Triton kernels (backends/triton/kernels/routing.py) compute the
// same bits in the same steps; these are written to be right first, simple loops where the sizes are small
// (a chunk's pairs, a token's k slots).
//
// The sort takes three launches and no atomics, so every run gives the same rows: moe_count_kernel counts
// each chunk's pairs per expert (a chunk: `tokens` consecutive tokens), moe_scan_kernel turns the counts
// into each chunk's first rank per expert and the experts' boundaries, and moe_scatter_kernel ranks each
// pair among the earlier pairs of its chunk with the same expert. An expert id outside 0..E-1 drops its
// pair (no row); rows that hold no pair get rows = -1 from the scatter launch's extra blocks.
#include "common.cuh"

namespace qc {

constexpr int kRouteThreads = 256;

// The expert of pair (t, j), or -1 for an id outside 0..E-1 (compared before narrowing: an int64 id such
// as 2^32 + 1 must not wrap onto a real expert).
template <class Id>
__device__ __forceinline__ int expert_of(const Id* __restrict__ ids, long long st, long long sj, int t, int j,
                                         int E) {
  const long long v = (long long)ids[(long long)t * st + (long long)j * sj];
  return v >= 0 && v < E ? (int)v : -1;
}

// counts[p, e]: the pairs of chunk p (tokens p*tokens ...) routed to expert e. A thread per expert.
template <class Id>
__global__ void moe_count_kernel(const Id* __restrict__ ids, int* __restrict__ counts, long long st, long long sj,
                                 int T, int K, int E, int tokens) {
  const int p = blockIdx.x, t0 = p * tokens, t1 = min(T, t0 + tokens);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int t = t0; t < t1; ++t)
      for (int j = 0; j < K; ++j) c += expert_of(ids, st, sj, t, j, E) == e;
    counts[(long long)p * E + e] = c;
  }
}

// One block: counts[p, e] becomes the number of expert e's pairs in chunks before p (in place); bounds the
// experts' boundaries: masked, min(total, max_m) [E]; contiguous, the offsets [E + 1]. Dynamic shared
// memory: E ints.
__global__ void moe_scan_kernel(int* __restrict__ counts, int* __restrict__ bounds, int P, int E, int max_m,
                                int masked) {
  extern __shared__ int totals[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int running = 0;
    for (int p = 0; p < P; ++p) {
      const long long i = (long long)p * E + e;
      const int c = counts[i];
      counts[i] = running;
      running += c;
    }
    totals[e] = running;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (masked) {
    for (int e = 0; e < E; ++e) bounds[e] = min(totals[e], max_m);
  } else {
    int sum = 0;
    bounds[0] = 0;
    for (int e = 0; e < E; ++e) bounds[e + 1] = (sum += totals[e]);
  }
}

// Blocks t < T: token t's pairs to their rows (rows[row] = t*K + j), then the token quantized per 1 x G
// group (act_quant's numerics: common.cuh's block_scale and Divisor, the codes' encoders), its codes and
// scale written to each of its rows of q [slots, H] and scale [slots, ceil(H/G)]. blockquant.cuh's
// quantize_blocks stores each block once, where a token's codes go to its k rows: a group per step of the
// whole thread block instead, each thread's codes stored k times. Blocks from T: rows = -1 in kRouteThreads rows each where no pair lands.
// masked: row = e * max_m + rank, a pair ranked max_m or later dropped; else row = offsets[e] + rank.
// Dynamic shared memory: K long longs (the token's rows).
template <class T_, class Q, class Id>
__global__ void __launch_bounds__(kRouteThreads)
moe_scatter_kernel(const T_* __restrict__ x, const Id* __restrict__ ids, const int* __restrict__ firsts,
                   const int* __restrict__ bounds, typename Q::storage* __restrict__ q, float* __restrict__ scale,
                   int* __restrict__ rows, long long ldx, long long st, long long sj, int T, int H, int K, int E,
                   int tokens, long long slots, int max_m, int G, float eps, int ue8m0, int masked) {
  if (blockIdx.x >= T) {
    const long long s = (long long)(blockIdx.x - T) * kRouteThreads + threadIdx.x;
    if (s >= slots) return;
    const bool used = masked ? (int)(s % max_m) < bounds[s / max_m] : s < bounds[E];
    if (!used) rows[s] = -1;
    return;
  }
  extern __shared__ long long dest[];
  __shared__ u32 red[kRouteThreads / 32];
  const int t = blockIdx.x, p = t / tokens;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    const int e = expert_of(ids, st, sj, t, j, E);
    long long row = -1;
    if (e >= 0) {
      int rank = firsts[(long long)p * E + e];
      for (int u = p * tokens; u <= t; ++u)
        for (int i = 0; i < (u == t ? j : K); ++i) rank += expert_of(ids, st, sj, u, i, E) == e;
      if (!masked)
        row = bounds[e] + rank;
      else if (rank < max_m)
        row = (long long)e * max_m + rank;
      if (row >= 0) rows[row] = t * K + j;
    }
    dest[j] = row;
  }
  __syncthreads();
  const T_* src = x + (long long)t * ldx;
  const int groups = (H + G - 1) / G;
  // The trip count is the same for every thread, which all reach team_max's barriers.
  for (int g = 0; g < groups; ++g) {
    const int c0 = g * G, n = min(G, H - c0);
    u32 amax = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) amax = max(amax, abs_bits(to_f32(src[c0 + i])));
    const float s = block_scale(team_max<kRouteThreads>(amax, red), eps, Q::qmax, ue8m0 != 0);
    const Divisor divide(s);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const typename Q::storage code = Q::encode(divide(to_f32(src[c0 + i])));
      for (int j = 0; j < K; ++j)
        if (dest[j] >= 0) q[dest[j] * H + c0 + i] = code;
    }
    for (int j = threadIdx.x; j < K; j += blockDim.x)
      if (dest[j] >= 0) scale[dest[j] * groups + g] = s;
  }
}

// sources[pair] = the row holding it, for each row holding a pair (0..pairs-1); other entries are left as
// they were (the gather checks every entry it reads).
__global__ void moe_invert_kernel(const int* __restrict__ rows, int* __restrict__ sources, long long slots,
                                  long long pairs) {
  const long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  const int pair = rows[s];
  if (pair >= 0 && pair < pairs) sources[pair] = (int)s;
}

// out[t, n] = sum over j of w[t, j] * y[row of pair t*K + j, n] in fp32, j in order, each product rounded
// before the add (__fmul_rn / __fadd_rn: never contracted). sources[pair] is trusted only where rows names
// that pair back: an entry the invert kernel did not write (a dropped pair) holds whatever the memory held.
// Grid: (T, ceil(N / blockDim.x)).
template <class Y, class W, class O>
__global__ void moe_gather_kernel(const Y* __restrict__ y, const int* __restrict__ rows,
                                  const int* __restrict__ sources, const W* __restrict__ w, O* __restrict__ out,
                                  long long ldy, long long swt, long long swj, long long ldo, int N, int K,
                                  long long slots) {
  const int t = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float acc = 0.f;
  for (int j = 0; j < K; ++j) {
    const int pair = t * K + j, s = sources[pair];
    if (s >= 0 && s < slots && rows[s] == pair)
      acc = __fadd_rn(acc, __fmul_rn(to_f32(w[t * swt + j * swj]), to_f32(y[(long long)s * ldy + n])));
  }
  out[(long long)t * ldo + n] = from_f32<O>(acc);
}

}  // namespace qc
