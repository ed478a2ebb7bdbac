// Fused epilogues: dequant + bias after an integer/low-precision GEMM (seed 002), and quantized GELU
// (dequantize -> GELU -> re-quantize per 1 x G, seed 001) on the shared block quantizer.
#include "blockquant.cuh"

namespace qc {

// GELU of the dequantized input; the input's 1 x G blocks are the output's, so one scale per block.
template <class Q, bool TANH> struct GeluSource {
  const typename Q::storage* __restrict__ q;
  long long ld;
  const float* __restrict__ in_scale;
  long long is_r, is_c;
  float s;

  __device__ __forceinline__ bool begin_block(int rb, int cb) {
    s = in_scale[rb * is_r + cb * is_c];
    return true;
  }

  template <int VEC> __device__ __forceinline__ void load(int r, int c, float (&v)[VEC]) const {
    typename Q::storage e[VEC];
    load_vec(q + (long long)r * ld + c, e);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float x = __fmul_rn(Q::decode(e[j]), s);
      v[j] = activate(x, TANH ? kActGeluTanh : kActGelu);
    }
  }
};

// q [M, K] (scale [M, KB] at is_r/is_c strides) -> q2 [M, K] (row stride ldq2) and scale2 at
// ss_r/ss_c strides; the output arguments are quant_kernel's so that one launcher serves both.
template <class Q, class QOut, bool TANH, int VEC, int TEAM, int CACHE>
__global__ void __launch_bounds__(kQuantThreads)
quantized_gelu_kernel(const typename Q::storage* __restrict__ q, long long ldq, const float* __restrict__ scale,
                      long long is_r, long long is_c, typename QOut::storage* __restrict__ q2, long long ldq2,
                      float* __restrict__ scale2, long long ss_r, long long ss_c, int M, int K, int G, float eps,
                      int ue8m0) {
  quantize_blocks<GeluSource<Q, TANH>, QOut, VEC, TEAM, CACHE>(GeluSource<Q, TANH>{q, ldq, scale, is_r, is_c, 0.f},
                                                               q2, ldq2, scale2, ss_r, ss_c, M, K, 1, G, eps,
                                                               ue8m0 != 0);
}

// out[m, n] = fp32(g[m, n]) * sa[m] * sb[n] + fp32(bias[n]), left to right in fp32, rounded to OutT.
// bias is fp32, fp16 or bf16 (BiasT; other float dtypes the launcher converts to fp32) at stride bias_s, or
// null. Layout as dequant_kernel: VEC consecutive columns per thread, blockDim.x along a row, blockDim.y
// over rows.
template <class G, class OutT, class BiasT, int VEC>
__global__ void dequant_bias_kernel(const G* __restrict__ g, long long ldg, const float* __restrict__ sa,
                                    long long sa_s, const float* __restrict__ sb, long long sb_s,
                                    const BiasT* __restrict__ bias, long long bias_s, OutT* __restrict__ out,
                                    long long ldo, int M, int N) {
  const int n = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (n >= N) return;
  float colscale[VEC], colbias[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    colscale[j] = sb[(n + j) * sb_s];
    colbias[j] = bias ? to_f32(bias[(n + j) * bias_s]) : 0.f;
  }
  for (int m = blockIdx.y * blockDim.y + threadIdx.y; m < M; m += gridDim.y * blockDim.y) {
    const float rowscale = sa[m * sa_s];
    G e[VEC];
    load_vec(g + (long long)m * ldg + n, e);
    OutT o[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float v = __fmul_rn(__fmul_rn(to_f32(e[j]), rowscale), colscale[j]);
      o[j] = from_f32<OutT>(bias ? __fadd_rn(v, colbias[j]) : v);
    }
    store_vec(out + (long long)m * ldo + n, o);
  }
}

}  // namespace qc
