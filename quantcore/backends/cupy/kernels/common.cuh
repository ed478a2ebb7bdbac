// Numerics shared by every quantcore CUDA kernel: the exact encoders/decoders, the block-scale
// formula, activations, and 16-byte vector memory helpers.
//
// Everything here follows docs/backend-contract.md bit for bit (the activations up to expf, which is
// CUDA's own): divisions are __fdiv_rn (a quantizer's by its group's scale: `Divisor`, whose steps give
// __fdiv_rn's bits) and products that the contract evaluates left to right are
// __fmul_rn/__fadd_rn, so that the compiler cannot contract them into FMAs (compiled without fast
// math, so no flush-to-zero either).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace qc {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// ---------------------------------------------------------------- float element conversions

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(int x) { return __int2float_rn(x); }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// ---------------------------------------------------------------- quantized formats

// FP8 e4m3fn, encoded on the fp32 bits so that every architecture (with or without FP8 hardware)
// produces the same codes: round to nearest even, saturate finite and infinite overflow to ±448,
// NaN -> 0x7F with the sign kept.
struct Fp8E4M3 {
  typedef u8 storage;
  static constexpr float qmax = 448.f;

  static __device__ __forceinline__ storage encode(float v) {
    const u32 bits = __float_as_uint(v);
    const u32 sign = (bits >> 24) & 0x80u;
    const u32 mag = bits & 0x7fffffffu;
    u32 code;
    if (mag > 0x7f800000u) {
      code = 0x7fu;
    } else if (mag >= 0x43e00000u) {  // |v| >= 448, infinities included
      code = 0x7eu;
    } else if (mag < 0x3c800000u) {  // |v| < 2^-6: the subnormal grid is 2^-9, and x * 2^9 is exact
      code = (u32)__float2int_rn(__uint_as_float(mag) * 512.f);  // 8 lands on the first normal code
    } else {
      // Keep 3 of the 23 mantissa bits, ties to even; a carry moves into the exponent on its own.
      const u32 rounded = mag + 0x7ffffu + ((mag >> 20) & 1u);
      code = (rounded >> 20) - (120u << 3);  // rebias the exponent from 127 to 7
    }
    return (storage)(code | sign);
  }

  static __device__ __forceinline__ float decode(storage c) {
    const u32 sign = (u32)(c & 0x80u) << 24;
    const u32 e = (c >> 3) & 0xfu, m = c & 7u;
    if ((c & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u | sign);
    const float mag = e == 0 ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(mag) | sign);
  }
};

// Symmetric INT8: round half to even, clamp to ±127 (never -128), NaN -> 0.
struct Int8 {
  typedef signed char storage;
  static constexpr float qmax = 127.f;

  static __device__ __forceinline__ storage encode(float v) {
    // cvt.rni.s32.f32 rounds half to even, saturates, and gives 0 for NaN; then the clamp to ±127.
    return (storage)min(max(__float2int_rn(v), -127), 127);
  }

  static __device__ __forceinline__ float decode(storage c) { return (float)c; }
};

// ---------------------------------------------------------------- block scales

// |x| as ordered bits: as unsigned integers NaN > +Inf > every finite value, so a plain integer max
// is the contract's NaN-aware amax (fmaxf would drop NaN).
__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// Round a scale up to a normal power of two on its bits (ue8m0): a subnormal (exponent field 0) becomes
// 2^-126, as in the reference; non-finite scales pass unchanged.
__device__ __forceinline__ float ue8m0_ceil(float s) {
  u32 b = __float_as_uint(s);
  if ((b & 0x7f800000u) != 0x7f800000u && (b & 0x7fffffu) != 0) b = (b & 0xff800000u) + 0x800000u;
  return __uint_as_float(b);
}

// scale = max(amax, eps) / qmax. eps >= 0, so the max is taken on the ordered bits too: a NaN amax
// stays NaN.
__device__ __forceinline__ float block_scale(u32 amax_bits, float eps, float qmax, bool ue8m0) {
  const u32 floor_bits = __float_as_uint(eps);
  const float s = __fdiv_rn(__uint_as_float(amax_bits > floor_bits ? amax_bits : floor_bits), qmax);
  return ue8m0 ? ue8m0_ceil(s) : s;
}

// x / scale rounded as __fdiv_rn rounds, for a divisor shared by a group's values (a quantizer's scale:
// positive, or NaN / +Inf for a group holding one; |x| at most about qmax times it): the reciprocal once,
// then per value a product, the exact remainder by an FMA and one correction, four operations where
// __fdiv_rn takes about eleven and a branch. The Triton kernels' `quant.divide`, with the same steps:
// docs/numerics.md says why they give the correctly rounded quotient, and where not (below 2^-17, where
// every code is ±0 either way).
struct Divisor {
  float f, s, r;

  __device__ __forceinline__ explicit Divisor(float scale) {
    // A scale below 2^-64 (eps allows subnormal ones, whose reciprocal overflows) is divided as one 2^64
    // times larger, its values scaled alike: both exactly.
    f = scale < 5.421010862427522e-20f ? 18446744073709551616.f : 1.f;
    s = __fmul_rn(scale, f);
    r = __fdiv_rn(1.f, s);
    // An infinite scale has r = 0: with s taken as 0 the result is x * 0, as division by +Inf gives.
    if (r == 0.f) s = 0.f;
  }

  __device__ __forceinline__ float operator()(float x) const {
    x = __fmul_rn(x, f);
    const float q0 = __fmul_rn(x, r);
    // The remainder negated, s * q0 - x, and added times -r: a zero quotient keeps x's sign.
    return __fmaf_rn(__fmaf_rn(s, q0, -x), -r, q0);
  }
};

// ---------------------------------------------------------------- activations

enum Activation { kActNone = 0, kActGelu = 1, kActGeluTanh = 2, kActSilu = 3 };

// erfc(a) * exp(a^2) for a >= 0: the reference's erfcx (backends/torch/activation.py), the same
// polynomial in q = (a - 2) / (a + 2) by Horner's rule without contraction (CUDA's erfcxf divides
// approximately).
__device__ __forceinline__ float erfcx(float a) {
  const float q = __fdiv_rn(__fadd_rn(a, -2.f), __fadd_rn(a, 2.f));
  float p = 6.351467163767666e-05f;
  p = __fadd_rn(__fmul_rn(p, q), 0.00016087623953353614f);
  p = __fadd_rn(__fmul_rn(p, q), -0.0003582834324333817f);
  p = __fadd_rn(__fmul_rn(p, q), -0.0013958703493699431f);
  p = __fadd_rn(__fmul_rn(p, q), 0.0012177372118458152f);
  p = __fadd_rn(__fmul_rn(p, q), 0.00868928711861372f);
  p = __fadd_rn(__fmul_rn(p, q), -0.008019089698791504f);
  p = __fadd_rn(__fmul_rn(p, q), -0.054211996495723724f);
  p = __fadd_rn(__fmul_rn(p, q), 0.16404947638511658f);
  p = __fadd_rn(__fmul_rn(p, q), -0.1660310924053192f);
  p = __fadd_rn(__fmul_rn(p, q), -0.09276376664638519f);
  p = __fadd_rn(__fmul_rn(p, q), 0.27697840332984924f);
  return __fdiv_rn(__fadd_rn(1.f, p), __fadd_rn(1.f, __fmul_rn(2.f, a)));
}

// The contract's forms (docs/numerics.md), in the reference's operation order
// (backends/torch/activation.py): act(x) = x - T(|x|) for x >= 0 and -T(|x|) below, where the tail
// T(s) = s * gate(-s) applies its exponentially small factor last, as its square root twice, so that
// it stays accurate (and non-zero) in the negative tail, where 1 + erf(x / sqrt 2) cancels to 0.
// s is capped at 128, where T is 0 in fp32 for all three (an infinite s would give inf * 0).
__device__ __forceinline__ float act_tail(float s, int act) {
  s = s > 128.f ? 128.f : s;  // NaN fails the comparison and stays NaN
  if (act == kActGelu) {  // 0.5 * s * erfc(s / sqrt 2)
    const float a = __fmul_rn(s, 0.70710678118654752440f);
    const float h = expf(-__fmul_rn(0.5f, __fmul_rn(a, a)));
    return __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, s), erfcx(a)), h), h);
  }
  // s * sigmoid(-2u): tanh-GELU's u = sqrt(2 / pi) * (s + 0.044715 s^3); SiLU's 2u = s.
  const float u = act == kActSilu ? __fmul_rn(0.5f, s)
                                  : __fmul_rn(0.79788456080286535588f,
                                              __fadd_rn(s, __fmul_rn(0.044715f, __fmul_rn(__fmul_rn(s, s), s))));
  const float h = expf(-u);
  return __fmul_rn(__fmul_rn(__fdiv_rn(s, __fadd_rn(1.f, __fmul_rn(h, h))), h), h);
}

__device__ __forceinline__ float activate(float x, int act) {
  if (act == kActNone) return x;
  const float t = act_tail(fabsf(x), act);
  return x >= 0.f ? __fsub_rn(x, t) : -t;
}

// ---------------------------------------------------------------- vector memory

template <int BYTES> struct Chunk;
template <> struct Chunk<16> { typedef uint4 type; };
template <> struct Chunk<8> { typedef uint2 type; };
template <> struct Chunk<4> { typedef u32 type; };
template <> struct Chunk<2> { typedef u16 type; };
template <> struct Chunk<1> { typedef u8 type; };

// N consecutive elements moved with the widest accesses up to 16 bytes; the caller guarantees that
// p is aligned to min(16, N * sizeof(T)) bytes (the launcher picks N from the actual alignment).
template <class T, int N> __device__ __forceinline__ void load_vec(const T* __restrict__ p, T (&out)[N]) {
  constexpr int BYTES = N * (int)sizeof(T);
  constexpr int W = BYTES < 16 ? BYTES : 16;
  typedef typename Chunk<W>::type C;
  C tmp[BYTES / W];
#pragma unroll
  for (int i = 0; i < BYTES / W; ++i) tmp[i] = reinterpret_cast<const C*>(p)[i];
  memcpy(out, tmp, BYTES);
}

template <class T, int N> __device__ __forceinline__ void store_vec(T* __restrict__ p, const T (&in)[N]) {
  constexpr int BYTES = N * (int)sizeof(T);
  constexpr int W = BYTES < 16 ? BYTES : 16;
  typedef typename Chunk<W>::type C;
  C tmp[BYTES / W];
  memcpy(tmp, in, BYTES);
#pragma unroll
  for (int i = 0; i < BYTES / W; ++i) reinterpret_cast<C*>(p)[i] = tmp[i];
}

// ---------------------------------------------------------------- reductions

// Max over the TEAM threads sharing one block: lanes [k*TEAM, (k+1)*TEAM) when TEAM <= 32, else the
// whole thread block (TEAM == blockDim.x). Every thread of the block must call it.
template <int TEAM> __device__ __forceinline__ u32 team_max(u32 v, u32* red) {
#pragma unroll
  for (int o = (TEAM < 32 ? TEAM : 32) / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (TEAM > 32) {
    const int warp = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < TEAM / 32; ++w) v = max(v, red[w]);
    __syncthreads();  // red is rewritten by the next call
  }
  return v;
}

}  // namespace qc
