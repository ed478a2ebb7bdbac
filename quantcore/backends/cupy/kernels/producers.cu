// The fused producers (docs/numerics.md, "Fused producers"): RMSNorm with the residual add, and
// SiLU-and-multiply, each quantized per 1 x G by the shared block quantizer (blockquant.cuh) reading the
// fp32 values through a source of its own, so that codes and scales are act_quant's of those values.
#include "blockquant.cuh"

namespace qc {

// x rounded to nearest even in T and back: where the unfused code, written in T, rounds.
template <class T> __device__ __forceinline__ float round_to(float x) { return to_f32(from_f32<T>(x)); }

// The values the norm reads, in fp32: x, or x + residual rounded to x's type.
template <class T, bool RESIDUAL> struct NormInput {
  const T* __restrict__ x;
  long long ldx;
  const T* __restrict__ res;
  long long ldr;

  template <int VEC> __device__ __forceinline__ void load(int r, int c, float (&v)[VEC]) const {
    T e[VEC];
    load_vec(x + (long long)r * ldx + c, e);
    if (RESIDUAL) {
      T f[VEC];
      load_vec(res + (long long)r * ldr + c, f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = round_to<T>(__fadd_rn(to_f32(e[j]), to_f32(f[j])));
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = to_f32(e[j]);
    }
  }
};

// The sum of squares of row `row` in the contract's order: the squares padded with zeros to a power of two,
// neighbours added first, level by level. Thread t holds elements (p * kQuantThreads + t) * VEC + j of
// pass p, kept in v[p] (0 past the row): a chunk of VEC in registers, then the threads' chunks by a butterfly
// (a + b is b + a, bit for bit, so both lanes of a pair hold their pair's sum), the warps' sums, then the
// passes' sums; every level adds aligned neighbours, so it is the contract's tree over the row padded to
// kQuantThreads * VEC * PASSES, and zeros added to non-negative sums change no bit. VEC divides H, so a chunk
// lies wholly inside the row or past it. With RESIDUAL, the rounded x + residual is stored to new_res
// [.., H] as it is read.
template <class T, int VEC, int PASSES, bool RESIDUAL>
__device__ __forceinline__ float row_sum_squares(const NormInput<T, RESIDUAL>& in, T* __restrict__ new_res, int row,
                                                 int H, float (&v)[PASSES][VEC]) {
  constexpr int WARPS = kQuantThreads / 32;
  __shared__ float warp_sums[PASSES][WARPS];
  const int t = threadIdx.x;
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const int c = (p * kQuantThreads + t) * VEC;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[p][j] = 0.f;
    if (c < H) {
      in.template load<VEC>(row, c, v[p]);
      if (RESIDUAL) {
        T o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] = from_f32<T>(v[p][j]);
        store_vec(new_res + (long long)row * H + c, o);
      }
      float sq[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) sq[j] = __fmul_rn(v[p][j], v[p][j]);
#pragma unroll
      for (int w = 1; w < VEC; w <<= 1) {
#pragma unroll
        for (int j = 0; j < VEC; j += 2 * w) sq[j] = __fadd_rn(sq[j], sq[j + w]);
      }
      s = sq[0];
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (t % 32 == 0) warp_sums[p][t / 32] = s;
  }
  __syncthreads();
  float pass_sums[PASSES];
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    float w[WARPS];
#pragma unroll
    for (int i = 0; i < WARPS; ++i) w[i] = warp_sums[p][i];
#pragma unroll
    for (int k = 1; k < WARPS; k <<= 1) {
#pragma unroll
      for (int i = 0; i < WARPS; i += 2 * k) w[i] = __fadd_rn(w[i], w[i + k]);
    }
    pass_sums[p] = w[0];
  }
#pragma unroll
  for (int k = 1; k < PASSES; k <<= 1) {
#pragma unroll
    for (int p = 0; p < PASSES; p += 2 * k) pass_sums[p] = __fadd_rn(pass_sums[p], pass_sums[p + k]);
  }
  return pass_sums[0];
}

// weight * (v * rstd rounded to T), rounded to OutT: the values the norm quantizes.
template <class T, class W, class OutT, int VEC>
__device__ __forceinline__ void normalized(const W* __restrict__ w, float rstd, float (&v)[VEC]) {
  W e[VEC];
  load_vec(w, e);
#pragma unroll
  for (int j = 0; j < VEC; ++j) v[j] = round_to<OutT>(__fmul_rn(to_f32(e[j]), round_to<T>(__fmul_rn(v[j], rstd))));
}

// The normalized row as the block quantizer reads it (groups that a thread's chunks do not tile).
template <class T, class W, class OutT, bool RESIDUAL> struct NormSource {
  NormInput<T, RESIDUAL> in;
  const W* __restrict__ w;
  float rstd;
  int row;

  __device__ __forceinline__ bool begin_block(int, int) { return true; }

  template <int VEC> __device__ __forceinline__ void load(int, int c, float (&v)[VEC]) const {
    in.template load<VEC>(row, c, v);
    normalized<T, W, OutT, VEC>(w + c, rstd, v);
  }
};

// One thread block per row of x [M, H] (row stride ldx; residual [M, H] at ldr when RESIDUAL, the sum stored
// to new_res [M, H] contiguous): rstd = 1 / sqrt(sum / H + eps), IEEE division and square root, then the
// row quantized per 1 x G into q [M, H] and scale[row * ss_r + g * ss_c]. VEC is the sum's vector width (it
// divides H). LANES > 0: a group is LANES neighbouring threads' chunks (G = LANES * VEC), quantized from the
// registers the sum read (`quantize_lanes`); 0: by the block quantizer, which reads the row again (from L2)
// with its own QVEC, TEAM and CACHE.
template <class T, class W, class OutT, class Q, int VEC, int PASSES, bool RESIDUAL, int LANES, int QVEC, int TEAM,
          int CACHE>
__global__ void __launch_bounds__(kQuantThreads)
rms_norm_quant_kernel(const T* __restrict__ x, long long ldx, const W* __restrict__ w, const T* __restrict__ res,
                      long long ldr, typename Q::storage* __restrict__ q, float* __restrict__ scale, long long ss_r,
                      long long ss_c, T* __restrict__ new_res, int H, int G, float eps, float quant_eps, int ue8m0) {
  const int row = blockIdx.x;
  const NormInput<T, RESIDUAL> in{x, ldx, res, ldr};
  float v[PASSES][VEC];
  const float total = row_sum_squares<T, VEC, PASSES, RESIDUAL>(in, new_res, row, H, v);
  const float rstd = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, __int2float_rn(H)), eps)));
  if constexpr (LANES > 0) {
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      const int c = (p * kQuantThreads + threadIdx.x) * VEC;
      const bool present = c < H;
      if (present) normalized<T, W, OutT, VEC>(w + c, rstd, v[p]);
      quantize_lanes<Q, VEC, LANES>(v[p], present, q + (long long)row * H + c, scale + row * ss_r + (c / G) * ss_c,
                                    quant_eps, ue8m0 != 0);
    }
  } else {
    const NormSource<T, W, OutT, RESIDUAL> src{in, w, rstd, row};
    quantize_blocks_of<NormSource<T, W, OutT, RESIDUAL>, Q, QVEC, TEAM, CACHE>(
        src, q + (long long)row * H, H, scale + row * ss_r, ss_r, ss_c, 1, H, 1, G, quant_eps, ue8m0 != 0, 0, 1);
  }
}

// silu(gate) * up in fp32 of x [R, 2C] (gate the first C columns). With counts (int32, one per expert) the
// rows are experts' rows_per_expert rows in turn, and a row at or past its expert's count is skipped.
template <class T> struct GatedSource {
  const T* __restrict__ x;
  long long ld;
  int half;
  const int* __restrict__ counts;
  int rows_per_expert;

  __device__ __forceinline__ bool begin_block(int rb, int) const {
    return counts == nullptr || rb % rows_per_expert < counts[rb / rows_per_expert];
  }

  template <int VEC> __device__ __forceinline__ void load(int r, int c, float (&v)[VEC]) const {
    T gate[VEC], up[VEC];
    load_vec(x + (long long)r * ld + c, gate);
    load_vec(x + (long long)r * ld + half + c, up);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = __fmul_rn(activate(to_f32(gate[j]), kActSilu), to_f32(up[j]));
  }
};

// x [R, 2C] (row stride ld), counts null or int32 [R / rows_per_expert] -> q [R, C] (row stride ldq) and one
// scale per 1 x BC block at scale[r * ss_r + cb * ss_c]; the arguments after `counts` are quant_kernel's.
template <class T, class Q, int VEC, int TEAM, int CACHE>
__global__ void __launch_bounds__(kQuantThreads)
silu_mul_quant_kernel(const T* __restrict__ x, long long ld, const int* __restrict__ counts, int rows_per_expert,
                      typename Q::storage* __restrict__ q, long long ldq, float* __restrict__ scale, long long ss_r,
                      long long ss_c, int R, int C, int BR, int BC, float eps, int ue8m0) {
  quantize_blocks<GatedSource<T>, Q, VEC, TEAM, CACHE>(GatedSource<T>{x, ld, C, counts, rows_per_expert}, q, ldq,
                                                       scale, ss_r, ss_c, R, C, BR, BC, eps, ue8m0 != 0);
}

}  // namespace qc
