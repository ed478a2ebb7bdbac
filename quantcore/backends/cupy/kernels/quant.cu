// Block quantize and dequantize of float matrices: act_quant / weight_quant are quant_kernel with
// 1 x G or Bn x Bk blocks, act_dequant / weight_dequant are dequant_kernel with the same blocks.
#include "blockquant.cuh"

namespace qc {

template <class T> struct FloatSource {
  const T* __restrict__ x;
  long long ld;

  __device__ __forceinline__ bool begin_block(int, int) { return true; }

  template <int VEC> __device__ __forceinline__ void load(int r, int c, float (&v)[VEC]) const {
    T e[VEC];
    load_vec(x + (long long)r * ld + c, e);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = to_f32(e[j]);
  }
};

// x [R, C] (row stride ldx) -> q [R, C] (row stride ldq) and one scale per BR x BC block at
// scale[rb * ss_r + cb * ss_c].
template <class T, class Q, int VEC, int TEAM, int CACHE>
__global__ void __launch_bounds__(kQuantThreads)
quant_kernel(const T* __restrict__ x, long long ldx, typename Q::storage* __restrict__ q, long long ldq,
             float* __restrict__ scale, long long ss_r, long long ss_c, int R, int C, int BR, int BC,
             float eps, int ue8m0) {
  quantize_blocks<FloatSource<T>, Q, VEC, TEAM, CACHE>(FloatSource<T>{x, ldx}, q, ldq, scale, ss_r, ss_c,
                                                        R, C, BR, BC, eps, ue8m0 != 0);
}

// out[r, c] = fp32(q[r, c]) * scale[r / BR, c / BC], rounded to OutT. Each thread converts VEC
// consecutive elements that share one scale (the launcher makes VEC divide BC and C). Threads are
// laid out blockDim.x along a row and blockDim.y over rows.
template <class Q, class OutT, int VEC>
__global__ void dequant_kernel(const typename Q::storage* __restrict__ q, long long ldq,
                               const float* __restrict__ scale, long long ss_r, long long ss_c,
                               OutT* __restrict__ out, long long ldo, int R, int C, int BR, int BC) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (c >= C) return;
  for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < R; r += gridDim.y * blockDim.y) {
    const float s = scale[(r / BR) * ss_r + (c / BC) * ss_c];
    typename Q::storage e[VEC];
    load_vec(q + (long long)r * ldq + c, e);
    OutT o[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = from_f32<OutT>(__fmul_rn(Q::decode(e[j]), s));
    store_vec(out + (long long)r * ldo + c, o);
  }
}

}  // namespace qc
