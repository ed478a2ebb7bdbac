// The one block quantizer behind act_quant (1 x G blocks), weight_quant (Bn x Bk blocks) and
// quantized_gelu (1 x G blocks of GELU(dequantized input)).
//
// A team of TEAM threads owns one block at a time: it reads the block once for the amax (keeping
// the first CACHE vectors per thread in registers), reduces, writes the scale, then quantizes. Blocks
// too large for the cache are read a second time, which then hits L1/L2.
#pragma once

#include "common.cuh"

namespace qc {

constexpr int kQuantThreads = 256;

// Src supplies fp32 values: begin_block(rb, cb) once per block, which returns whether the block is
// computed at all (a masked row's is not: neither read nor written), then load<VEC>(r, c, v) for VEC
// consecutive elements of row r from column c; both are called only inside the matrix. The thread block
// takes blocks `cta`, cta + ctas, ... in teams (`quantize_blocks`: the grid's blocks, grid-strided).
template <class Src, class Q, int VEC, int TEAM, int CACHE>
__device__ __forceinline__ void quantize_blocks_of(Src src, typename Q::storage* __restrict__ q, long long ldq,
                                                   float* __restrict__ scale, long long ss_r, long long ss_c,
                                                   int R, int C, int BR, int BC, float eps, bool ue8m0, int cta,
                                                   int ctas) {
  static_assert(TEAM <= 32 || TEAM == kQuantThreads, "a team is a power of two within a warp, or the block");
  constexpr int TEAMS = kQuantThreads / TEAM;
  __shared__ u32 red[kQuantThreads / 32];
  const int team = threadIdx.x / TEAM, lane = threadIdx.x % TEAM;
  const int CB = (C + BC - 1) / BC;
  const int nblocks = ((R + BR - 1) / BR) * CB;  // the launcher keeps this below 2^31

  // The trip count is uniform over the thread block so that every thread reaches team_max.
  for (int base = cta * TEAMS; base < nblocks; base += ctas * TEAMS) {
    const int b = base + team;
    bool live = b < nblocks;
    const int rb = live ? b / CB : 0, cb = live ? b % CB : 0;
    if (live) live = src.begin_block(rb, cb);
    const int r0 = rb * BR, c0 = cb * BC;
    const int nvr = (min(BC, C - c0) + VEC - 1) / VEC;  // VEC divides the row length unless VEC == 1
    const int total = live ? min(BR, R - r0) * nvr : 0;

    float cache[CACHE > 0 ? CACHE : 1][VEC];
    u32 amax = 0;
#pragma unroll
    for (int it = 0; it < CACHE; ++it) {
      const int i = lane + it * TEAM;
      if (i < total) {
        src.template load<VEC>(r0 + i / nvr, c0 + (i % nvr) * VEC, cache[it]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) amax = max(amax, abs_bits(cache[it][j]));
      }
    }
    for (int i = lane + CACHE * TEAM; i < total; i += TEAM) {
      float v[VEC];
      src.template load<VEC>(r0 + i / nvr, c0 + (i % nvr) * VEC, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) amax = max(amax, abs_bits(v[j]));
    }

    const float s = block_scale(team_max<TEAM>(amax, red), eps, Q::qmax, ue8m0);
    if (live && lane == 0) scale[rb * ss_r + cb * ss_c] = s;
    const Divisor divide(s);

    auto emit = [&](int i, const float (&v)[VEC]) {
      typename Q::storage out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = Q::encode(divide(v[j]));
      store_vec(q + (long long)(r0 + i / nvr) * ldq + c0 + (i % nvr) * VEC, out);
    };
#pragma unroll
    for (int it = 0; it < CACHE; ++it) {
      const int i = lane + it * TEAM;
      if (i < total) emit(i, cache[it]);
    }
    for (int i = lane + CACHE * TEAM; i < total; i += TEAM) {
      float v[VEC];
      src.template load<VEC>(r0 + i / nvr, c0 + (i % nvr) * VEC, v);
      emit(i, v);
    }
  }
}

// One 1 x (LANES * VEC) group held in registers by LANES neighbouring lanes of a warp (aligned to LANES, a
// power of two up to 32), VEC consecutive values each, in order: the group's scale from the amax over the
// lanes, each lane's codes stored at q (VEC of them) and the scale by the group's first lane. A lane whose
// values lie past the row (`present` false: a tail group) adds nothing to the amax and stores nothing; every
// lane of the warp must call it (the shuffles).
template <class Q, int VEC, int LANES>
__device__ __forceinline__ void quantize_lanes(const float (&v)[VEC], bool present, typename Q::storage* __restrict__ q,
                                               float* __restrict__ scale, float eps, bool ue8m0) {
  static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "a group's lanes: a power of two in a warp");
  u32 amax = 0;
  if (present) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) amax = max(amax, abs_bits(v[j]));
  }
#pragma unroll
  for (int o = 1; o < LANES; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = block_scale(amax, eps, Q::qmax, ue8m0);
  if (!present) return;
  const Divisor divide(s);
  typename Q::storage out[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = Q::encode(divide(v[j]));
  store_vec(q, out);
  if (threadIdx.x % LANES == 0) *scale = s;
}

template <class Src, class Q, int VEC, int TEAM, int CACHE>
__device__ __forceinline__ void quantize_blocks(Src src, typename Q::storage* __restrict__ q, long long ldq,
                                                float* __restrict__ scale, long long ss_r, long long ss_c,
                                                int R, int C, int BR, int BC, float eps, bool ue8m0) {
  quantize_blocks_of<Src, Q, VEC, TEAM, CACHE>(src, q, ldq, scale, ss_r, ss_c, R, C, BR, BC, eps, ue8m0, blockIdx.x,
                                               gridDim.x);
}

}  // namespace qc
