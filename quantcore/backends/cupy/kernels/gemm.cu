// Block-scaled GEMM: out[m, n] = sum_kb fp32(dot_kb(a, b)[m, n]) * a_s[m, kb] * b_s[n / Bn, kb], then
// bias, activation, and a cast or a 1 x out_group re-quantize (docs/backend-contract.md).
//
// a [M, K] and b [N, K] are 8-bit (FP8 e4m3 or INT8), both K-contiguous. A thread block computes a
// BM x BN tile with WM x WN warps; K advances BK (64 or 128) bytes per pipeline stage through a
// STAGES-deep ring of shared-memory buffers filled with cp.async (sm_80+) or plain 16-byte loads
// (sm_75). Warps read fragments with ldmatrix and run one of three tensor-core paths, chosen by KIND:
//   kMmaE4M3  FP8 x FP8 -> fp32, mma.m16n8k32.e4m3 (sm_89+)
//   kMmaS8    INT8 x INT8 -> exact int32, mma.m16n8k32.s8 (sm_80+) or 4 x mma.m8n8k16.s8 (sm_75)
//   kMmaF16   FP8 on GPUs without FP8 MMA (sm_75..sm_86): each e4m3 byte becomes an fp16 equal to
//             its value times 2^-8 (exact: fp16 holds every e4m3 value), products are exact, the sum
//             is fp32, and the 2^16 is taken back when the K block is scaled. mma.m16n8k16 (sm_80+)
//             or mma.m16n8k8 (sm_75).
// Every K block's dot product lives in its own accumulator and is folded into the fp32 result with
// its two scales at the block's end, so block_k only has to be a multiple of the 32-wide MMA step.
//
// A float activation (AT = float, __half or __nv_bfloat16 instead of the codes' u8) is quantized in
// the prologue, the quantized linear in one launch: each program quantizes its rows' K range per
// 1 x block_k group with act_quant's formulas (blockquant.cuh, bit for bit) into shared memory, codes
// and scales, while the first weight stages load; the main loop then reads A from there. With ONCE the
// programs quantize it once between them instead, into a global workspace (`quantize_once`), and the
// main loop reads those codes as it reads quantized input.
//
// Split-K runs in the same launch: blockIdx.z takes a contiguous range of K blocks, every (split,
// tile) program stores its fp32 partial tile in a workspace and counts itself in a per-tile counter;
// the program that counts last sums the partials in split order 0, 1, ... (so the result does not
// depend on which program finished last), runs the epilogue and sets the counter back to zero for
// the next launch. launch.py explains the tile, stage and split choices.
#include "common.cuh"

namespace qc {

enum MmaKind { kMmaE4M3 = 0, kMmaS8 = 1, kMmaF16 = 2 };
enum OutKind { kOutF32 = 0, kOutBF16 = 1, kOutF16 = 2, kOutFp8 = 3, kOutInt8 = 4 };
enum BiasKind { kBiasF32 = 0, kBiasBF16 = 1, kBiasF16 = 2 };  // the float dtypes read as they are

template <bool C, class A, class B> struct Select { typedef A type; };
template <class A, class B> struct Select<false, A, B> { typedef B type; };

// ---------------------------------------------------------------- shared-memory traffic

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Keeps a loop-invariant 64-bit value in a register: NVVM otherwise recomputes such values (64-bit
// products of kernel parameters) at every use inside the main loop.
template <class T> __device__ __forceinline__ void pin(T& v) {
  static_assert(sizeof(T) == 8, "64-bit values");
  asm volatile("" : "+l"(v));
}

// A stage holds rows of BK bytes (64 or 128). XOR-ing the 16-byte chunk index with the row's index
// among the 128-byte bank lines (row / 2 for 64-byte rows, row for 128-byte rows) puts the 8
// consecutive rows an ldmatrix phase reads (and the chunks a cp.async phase writes) in 8 different
// bank groups.
template <int BK> __device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(BK == 64 || BK == 128, "stages are 64 or 128 bytes of K");
  return row * BK + ((chunk ^ (row / (128 / BK))) & (BK / 16 - 1)) * 16;
}

// Copies `valid` (0..16) bytes of a 16-byte chunk and zero-fills the rest; src is read only when
// valid > 0. ALIGNED: src is 16-byte aligned and valid is 0 or 16; otherwise bytes are read one by one.
// L2: data other SMs wrote in this launch, read from L2 (cp.async.cg is L2-only already), never L1.
template <bool ALIGNED, bool L2> __device__ __forceinline__ void copy_chunk(u8* dst, const u8* src, int valid) {
  if (ALIGNED) {
#if __CUDA_ARCH__ >= 800
    // The ignore-src predicate zero-fills without reading: no address select, no size arithmetic.
    asm volatile("{\n.reg .pred z;\nsetp.eq.u32 z, %2, 0;\ncp.async.cg.shared.global [%0], [%1], 16, z;\n}\n"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(valid));
#else
    const uint4* p = reinterpret_cast<const uint4*>(src);
    *reinterpret_cast<uint4*>(dst) = valid ? (L2 ? __ldcg(p) : *p) : make_uint4(0, 0, 0, 0);
#endif
  } else {
    u8 v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = j < valid ? (L2 ? __ldcg(src + j) : src[j]) : 0;
    store_vec(dst, v);
  }
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Copies rows [row0, row0 + ROWS) x K bytes [k0, k0 + BK) of a K-contiguous matrix into a stage;
// rows >= nrows and bytes >= kend read as zero. THREADS is a multiple of a row's CH chunks, so a
// thread always copies the same 16-byte column of rows r0, r0 + RSTEP, ...: one source pointer and
// one shared offset, set up once (RSTEP is a multiple of 8 rows, which the swizzle repeats after).
// L2: see copy_chunk.
template <int ROWS, int BK, int THREADS, bool ALIGNED, bool L2 = false> struct RowLoader {
  static constexpr int CH = BK / 16, RSTEP = THREADS / CH, ITERS = (ROWS + RSTEP - 1) / RSTEP;
  static_assert(THREADS % CH == 0 && RSTEP % 8 == 0, "a thread's rows are 8-row multiples apart");
  const u8* src;   // row r0, K byte kch
  long long step;  // RSTEP rows
  int r0, rows, dst, kch;  // first row; rows of the matrix from r0 on; shared offset; K offset

  __device__ __forceinline__ RowLoader(const u8* base, long long ld, int row0, int nrows) {
    r0 = threadIdx.x / CH;
    kch = threadIdx.x % CH * 16;
    src = base + (long long)(row0 + r0) * ld + kch;
    step = RSTEP * ld;
    pin(src);
    pin(step);
    rows = nrows - row0 - r0;
    dst = swizzle<BK>(r0, kch / 16);
  }

  __device__ __forceinline__ void load(u8* stage, int k0, int kend) const {
    const int kvalid = min(max(kend - k0 - kch, 0), 16);
    const u8* p = src + k0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i, p += step) {
      if (ROWS % RSTEP != 0 && r0 + i * RSTEP >= ROWS) break;
      copy_chunk<ALIGNED, L2>(stage + dst + i * RSTEP * BK, p, i * RSTEP < rows ? kvalid : 0);
    }
  }
};

// ---------------------------------------------------------------- tensor-core steps

// e4m3 byte pair -> fp16 pair equal to the values times 2^-8: sign stays, exponent and mantissa
// shift into fp16's fields (subnormals included). sel picks bytes (0, 1) or (2, 3) of x.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 x, u32 sel) {
  const u32 t = __byte_perm(x, 0u, sel);
  return (t & 0x80008000u) | ((t & 0x7f007f00u) >> 1);
}
constexpr u32 kLoPair = 0x1404u, kHiPair = 0x3424u;

// One m16n8k32 step on 8-bit fragments as ldmatrix delivers them:
//   A: a[0] rows 0-7 k 0-15, a[1] rows 8-15 k 0-15, a[2] rows 0-7 k 16-31, a[3] rows 8-15 k 16-31
//   B: b[0] k 0-15, b[1] k 16-31;  thread (g = lane/4, t = lane%4) holds k 4t..4t+3 of row/col g.
// prep_* turns them into the registers run() consumes (a copy, or the fp16 expansion).
template <int KIND> struct Mma {
  static constexpr int AR = KIND == kMmaF16 ? 8 : 4;
  static constexpr int BR = KIND == kMmaF16 ? 4 : 2;
  typedef typename Select<KIND == kMmaS8, int, float>::type acc_t;

  static __device__ __forceinline__ void prep_a(const u32 (&in)[4], u32 (&out)[AR]) {
    if constexpr (KIND == kMmaF16) {
      // Two m16n8k16 A fragments over a permutation of k that prep_b applies to B as well.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        out[4 * h + 0] = e4m3x2_to_f16x2(in[2 * h], kLoPair);
        out[4 * h + 1] = e4m3x2_to_f16x2(in[2 * h + 1], kLoPair);
        out[4 * h + 2] = e4m3x2_to_f16x2(in[2 * h], kHiPair);
        out[4 * h + 3] = e4m3x2_to_f16x2(in[2 * h + 1], kHiPair);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = in[i];
    }
  }

  static __device__ __forceinline__ void prep_b(u32 b0, u32 b1, u32 (&out)[BR]) {
    if constexpr (KIND == kMmaF16) {
      out[0] = e4m3x2_to_f16x2(b0, kLoPair);
      out[1] = e4m3x2_to_f16x2(b0, kHiPair);
      out[2] = e4m3x2_to_f16x2(b1, kLoPair);
      out[3] = e4m3x2_to_f16x2(b1, kHiPair);
    } else {
      out[0] = b0;
      out[1] = b1;
    }
  }

  // The accumulator d holds c0, c1 (row g, cols 2t, 2t+1) and c2, c3 (row g + 8).
  static __device__ __forceinline__ void run(acc_t (&d)[4], const u32 (&a)[AR], const u32 (&b)[BR]) {
    if constexpr (KIND == kMmaE4M3) {
#if __CUDA_ARCH__ >= 890
      asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
    } else if constexpr (KIND == kMmaS8) {
#if __CUDA_ARCH__ >= 800
      asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
      // The m16n8k32 tile as four m8n8k16 tiles: (rows 0-7 | 8-15) x (k 0-15 | 16-31).
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rows = i >> 1, kh = i & 1;
        asm("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
            : "+r"(d[2 * rows]), "+r"(d[2 * rows + 1])
            : "r"(a[2 * kh + rows]), "r"(b[kh]));
      }
#endif
    } else {
#if __CUDA_ARCH__ >= 800
#pragma unroll
      for (int h = 0; h < 2; ++h)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[4 * h]), "r"(a[4 * h + 1]), "r"(a[4 * h + 2]), "r"(a[4 * h + 3]), "r"(b[2 * h]), "r"(b[2 * h + 1]));
#else
#pragma unroll
      for (int i = 0; i < 4; ++i)
        asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[2 * i]), "r"(a[2 * i + 1]), "r"(b[i]));
#endif
    }
  }

  // fp32 of one K block's dot product (kMmaF16 computed it 2^-16 too small; the product is exact).
  static __device__ __forceinline__ float dot(acc_t x) {
    if constexpr (KIND == kMmaS8) return __int2float_rn(x);
    else if constexpr (KIND == kMmaF16) return x * 65536.f;
    else return x;
  }
};

// ---------------------------------------------------------------- epilogue

struct Epilogue {
  const void* bias;  // [N] of bias_kind at stride bias_s, or null
  long long bias_s;
  int bias_kind;
  void* out;
  long long ldo;
  float* out_scale;  // re-quantize only
  long long os_m, os_n;
  int M, N, act, out_kind, out_group, ue8m0;
  float eps;
};

template <class T>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int n, int N, bool vec, const T (&v)[8]) {
  if (vec && n + 8 <= N) {
    store_vec(row + n, v);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (n + j < N) row[n + j] = v[j];
  }
}

template <class T> __device__ __forceinline__ void cast_chunk(const Epilogue& e, int m, int n, bool vec, const float (&v)[8]) {
  T o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = from_f32<T>(v[j]);
  if (m < e.M) store_chunk(static_cast<T*>(e.out) + m * e.ldo, n, e.N, vec, o);
}

// 1 x G re-quantize with act_quant's formulas. G is a power of two: below 8 the groups sit inside
// the thread's chunk, above 8 they span G/8 consecutive, aligned lanes of one row.
template <class Q> __device__ __forceinline__ void requant_chunk(const Epilogue& e, int m, int n, bool vec, const float (&v)[8]) {
  const int G = e.out_group;
  u32 amax[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) amax[j] = n + j < e.N ? abs_bits(v[j]) : 0u;
#pragma unroll
  for (int w = 1; w < 8; w <<= 1) {
    if (w < G) {
      u32 t[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) t[j] = max(amax[j], amax[j ^ w]);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax[j] = t[j];
    }
  }
  if (G > 8) {
    u32 x = amax[0];
    for (int o = 1; o < G / 8; o <<= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
#pragma unroll
    for (int j = 0; j < 8; ++j) amax[j] = x;
  }
  typename Q::storage o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float s = block_scale(amax[j], e.eps, Q::qmax, e.ue8m0 != 0);
    o[j] = Q::encode(__fdiv_rn(v[j], s));
    if ((n + j) % G == 0 && n + j < e.N && m < e.M) e.out_scale[m * e.os_m + ((n + j) / G) * e.os_n] = s;
  }
  if (m < e.M) store_chunk(static_cast<typename Q::storage*>(e.out) + m * e.ldo, n, e.N, vec, o);
}

__device__ __forceinline__ float bias_at(const Epilogue& e, int n) {
  const long long i = n * e.bias_s;
  switch (e.bias_kind) {
    case kBiasBF16: return to_f32(static_cast<const __nv_bfloat16*>(e.bias)[i]);
    case kBiasF16: return to_f32(static_cast<const __half*>(e.bias)[i]);
    default: return static_cast<const float*>(e.bias)[i];
  }
}

// Finishes columns n..n+7 of row m from their fp32 accumulators. Every lane of the warp calls it
// (re-quantize shuffles), rows >= M and columns >= N included; they write nothing.
__device__ __forceinline__ void finish_chunk(const Epilogue& e, int m, int n, float (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (e.bias && n + j < e.N) v[j] = v[j] + bias_at(e, n + j);
    v[j] = activate(v[j], e.act);
  }
  const bool vec = ((e.N | e.ldo) & 7) == 0 && (reinterpret_cast<u64>(e.out) & 15) == 0;
  switch (e.out_kind) {
    case kOutF32: cast_chunk<float>(e, m, n, vec, v); break;
    case kOutBF16: cast_chunk<__nv_bfloat16>(e, m, n, vec, v); break;
    case kOutF16: cast_chunk<__half>(e, m, n, vec, v); break;
    case kOutFp8: requant_chunk<Fp8E4M3>(e, m, n, vec, v); break;
    default: requant_chunk<Int8>(e, m, n, vec, v); break;
  }
}

// ---------------------------------------------------------------- split-K partials

// 8 consecutive floats through L2 only (st.cg / ld.cg): partials are written by one SM and read by
// another within the launch, so the reader must not be served by its own L1. p is 32-byte aligned.
__device__ __forceinline__ void store_cg8(float* p, const float (&v)[8]) {
  __stcg(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
  __stcg(reinterpret_cast<float4*>(p) + 1, make_float4(v[4], v[5], v[6], v[7]));
}

__device__ __forceinline__ void load_cg8(const float* p, float (&v)[8]) {
  const float4 x = __ldcg(reinterpret_cast<const float4*>(p)), y = __ldcg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
}

// ---------------------------------------------------------------- the GEMM

// blockIdx.z takes K range [z * k_split, (z + 1) * k_split) (k_split a multiple of block_k). With one
// split (gridDim.z == 1) the tile is finished in place. Otherwise ws holds a BM x BN fp32 slot per
// (tile, split), tile-major (rows past M are never touched), and counters one int per tile
// (gridDim.x * gridDim.y of them), all zero at launch; the launch leaves them zero again.
// Bytes per row of the prologue's quantized A (FUSED): the K range rounded up to whole stages, plus
// 16 so that the 8 rows an ldmatrix phase reads fall in 8 different bank groups. The launcher sizes
// shared memory with the same formula (launch.py, `fused_a_bytes`).
__host__ __device__ constexpr int fused_row_bytes(int k_split, int bk) { return (k_split + bk - 1) / bk * bk + 16; }

// The quantized linear's prologue: rows [m0, min(m0 + BM, M)) of the float activation a over K
// [kz0, kz1) quantized per 1 x block_k group (groups start at kz0, a multiple of block_k; block_k <= 128)
// with act_quant's formulas, codes to qa (row stride ldq bytes) and scales to sa (row stride lds).
// A team of 8 lanes takes a (row, group), each lane block_k / 8 consecutive elements loaded at once and
// kept in registers: one memory round trip per team, four teams per warp. Codes past kz1 up to the
// group's end are zero. Rows past M are left as they are: the MMA keeps rows apart, and their results
// are never stored.
template <class Q, class AT>
__device__ __forceinline__ void quantize_rows(const AT* __restrict__ a, long long lda, u8* qa, int ldq, float* sa,
                                              int lds, int m0, int BM, int M, int kz0, int kz1, int block_k,
                                              float eps, bool ue8m0) {
  constexpr int TEAM = 8, MAXE = 128 / TEAM;
  const int lane = threadIdx.x % TEAM, teams = blockDim.x / TEAM, per = block_k / TEAM;
  const int rows = min(BM, M - m0), groups = (kz1 - kz0 + block_k - 1) / block_k;
  // A warp's four teams take consecutive (row, group) pairs and step together, so that every lane of a
  // warp reaches the shuffles in every round.
  const int pairs = rows * groups;
  for (int q = threadIdx.x / 32 * (32 / TEAM); q < pairs; q += teams) {
    const int p = q + threadIdx.x % 32 / TEAM;
    const bool live = p < pairs;
    const int r = live ? p / groups : 0, kb = live ? p % groups : 0;
    const int k0 = kz0 + kb * block_k + lane * per, kend = live ? min(kz1, kz0 + (kb + 1) * block_k) : 0;
    const AT* src = a + (long long)(m0 + r) * lda;
    float v[MAXE];
    u32 amax = 0;
#pragma unroll
    for (int j = 0; j < MAXE; ++j) {
      v[j] = j < per && k0 + j < kend ? to_f32(src[k0 + j]) : 0.f;
      amax = max(amax, abs_bits(v[j]));
    }
#pragma unroll
    for (int o = TEAM / 2; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = block_scale(amax, eps, Q::qmax, ue8m0);
    const Divisor divide(s);
    u8 codes[MAXE];
#pragma unroll
    for (int j = 0; j < MAXE; ++j) {
      const typename Q::storage c = Q::encode(k0 + j < kend ? divide(v[j]) : 0.f);
      codes[j] = reinterpret_cast<const u8&>(c);
    }
    if (!live) continue;
    u8* dst = qa + r * ldq + kb * block_k + lane * per;
#pragma unroll
    for (int j = 0; j < MAXE; j += 4)  // per is a multiple of 4: block_k is one of 32
      if (j < per) *reinterpret_cast<u32*>(dst + j) = codes[j] | codes[j + 1] << 8 | codes[j + 2] << 16 | (u32)codes[j + 3] << 24;
    if (lane == 0) sa[r * lds + kb] = s;
  }
}

// The float activation quantized once per launch for every program that reads it (ONCE): rows
// [m0, min(m0 + BM, M)) over K blocks [kb0, kb1) into codes q (row stride kpad = K rounded up to
// block_k, zero past K) and scales s (K-block-major, K block stride mpad = M rounded up to 32:
// runtime/workspace.py's `once_buffers`), shared with the `shares` programs that read the same blocks
// (this one is `share`). Per K block an int flag says: 0 unclaimed, 1 being quantized, 2 published;
// a count of the programs done reading follows them (release_once).
// A program claims its own blocks (every shares-th from its share) and quantizes them, then waits
// until every block of its range is claimed, for at most PATIENCE polls, after which it claims and
// quantizes the blocks still unclaimed (their owner has not started), and then waits until every
// block is published. Past the bounded wait it waits only on flags at 1, held by running programs
// that never wait before publishing, so no order of dispatch can deadlock. Warp 0 polls the flags.
// The same protocol as the Triton decode kernel's (backends/triton/kernels/quantize_once.py).
template <class Q, class AT>
__device__ __noinline__ void quantize_once(const AT* __restrict__ a, long long lda, u8* q, float* s, int* flags,
                                           int m0, int BM, int M, int K, int kb0, int kb1, int block_k, float eps,
                                           bool ue8m0, int share, int shares) {
  constexpr int PATIENCE = 32;
  __shared__ u32 won;  // the blocks of a 32-block chunk this program took over
  const int kpad = (K + block_k - 1) / block_k * block_k, mpad = (M + 31) / 32 * 32;
  auto publish = [&](int kb) {
    quantize_rows<Q>(a, lda, q + (long long)m0 * kpad + kb * block_k, kpad, s + kb * mpad + m0, 1, m0, BM, M,
                     kb * block_k, min(K, (kb + 1) * block_k), block_k, eps, ue8m0);
    __syncthreads();  // every thread's codes written before the flag says so
    if (threadIdx.x == 0) {
      __threadfence();
      atomicExch(flags + kb, 2);
    }
  };
  // Whether some block of the range has (or, `equal` false, has not) flag `value`: read by warp 0.
  auto seen = [&](int value, bool equal) {
    bool found = false;
    if (threadIdx.x < 32)
      for (int kb = kb0 + threadIdx.x; kb < kb1; kb += 32)
        found |= (*reinterpret_cast<volatile int*>(flags + kb) == value) == equal;
    return __syncthreads_or(found) != 0;
  };

  for (int kb = kb0 + share; kb < kb1; kb += shares)
    if (__syncthreads_or(threadIdx.x == 0 && atomicCAS(flags + kb, 0, 1) == 0)) publish(kb);
  for (int polls = 0; polls < PATIENCE && seen(0, true); ++polls) {
  }
  for (int base = kb0; base < kb1; base += 32) {
    if (threadIdx.x < 32) {
      const int kb = base + threadIdx.x;
      const bool open = kb < kb1 && *reinterpret_cast<volatile int*>(flags + kb) == 0;
      const u32 mask = __ballot_sync(0xffffffffu, open && atomicCAS(flags + kb, 0, 1) == 0);
      if (threadIdx.x == 0) won = mask;
    }
    __syncthreads();
    u32 mine = won;
    __syncthreads();  // read by every thread before the next chunk rewrites it
    for (; mine; mine &= mine - 1) publish(base + __ffs(mine) - 1);
  }
  while (seen(2, false)) {
  }
  __threadfence();  // the codes' loads after the flags that published them
}

// After its last read of the codes: count this program in; the launch's last program sets the
// num_kb flags and the count back to 0 for the next launch (stream order), as the split-K counters.
__device__ __forceinline__ void release_once(int* flags, int num_kb, int programs) {
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(flags + num_kb, 1) == programs - 1) {
      for (int kb = 0; kb <= num_kb; ++kb) flags[kb] = 0;
      __threadfence();
    }
  }
}

template <class T> struct IsCode { static constexpr bool value = false; };
template <> struct IsCode<u8> { static constexpr bool value = true; };

// ---------------------------------------------------------------- grouped (mixture-of-experts) launches
//
// A grouped launch runs the dense program on one expert's rows: each program finds its expert, moves every
// operand to that expert (b [E, N, K], b_scale, bias [E, N], and the activation's and output's rows) and
// sets M to the expert's row count, so an expert's rows get the dense GEMM's sums bit for bit (its K
// unsplit). Row counts are read on the device: no host synchronization, and a graph replays the launch
// with whatever counts the device holds.
//   kContiguous: rows sorted by expert, rows[e]..rows[e+1] (int32 offsets [E + 1]); blockIdx.x is a slot
//                of the bound ceil(M / BM) + E on the row tiles, taken in expert order; slots past the
//                last tile exit.
//   kMasked:     a [E, max_m, K] with rows[e] (int32 [E], clamped to 0..max_m) rows each; blockIdx.x is
//                expert x ceil(max_m / BM) + row tile.
enum Grouping { kDense = 0, kContiguous = 1, kMasked = 2 };

struct ExpertTile {
  int e, first, count, m0;  // expert, its first row (contiguous), its rows, the tile's first row among them
};

// Every warp scans the offsets by itself, 32 experts a step, one per lane: a lane's tile count, a prefix
// sum over the warp, and the first lane whose running count passes the slot.
template <int BM> __device__ __forceinline__ ExpertTile contiguous_tile(const int* offsets, int experts, int slot) {
  const int lane = threadIdx.x & 31;
  int before = 0;  // row tiles of the experts scanned so far
  for (int base = 0; base < experts; base += 32) {
    const int e = base + lane;
    const int lo = e < experts ? __ldg(offsets + e) : 0, count = e < experts ? __ldg(offsets + e + 1) - lo : 0;
    const int tiles = (count + BM - 1) / BM;
    int ends = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, ends, o);
      if (lane >= o) ends += v;
    }
    const u32 past = __ballot_sync(0xffffffffu, before + ends > slot);
    if (past) {
      const int l = __ffs(past) - 1;
      const int start = before + __shfl_sync(0xffffffffu, ends - tiles, l);
      return {base + l, __shfl_sync(0xffffffffu, lo, l), __shfl_sync(0xffffffffu, count, l), (slot - start) * BM};
    }
    before += __shfl_sync(0xffffffffu, ends, 31);
  }
  return {0, 0, 0, 0};
}

template <int BM> __device__ __forceinline__ ExpertTile masked_tile(const int* counts, int max_m, int x) {
  const int tiles = (max_m + BM - 1) / BM, e = x / tiles;
  return {e, 0, min(max(__ldg(counts + e), 0), max_m), x % tiles * BM};
}

__device__ __forceinline__ int out_bytes(int out_kind) {
  return out_kind == kOutF32 ? 4 : out_kind == kOutFp8 || out_kind == kOutInt8 ? 1 : 2;
}

// ONCE (a float AT, one row tile: M <= BM): once_q, once_s and once_flags are quantize_once's q, s and
// flags, zero flags between launches; unused otherwise. GROUPED (a Grouping; codes only, K unsplit): rows
// is the expert table, experts E, and *_e the expert strides of a, a_scale, b, b_scale, bias, out and
// out_scale in elements (0 for a contiguous layout's activation, scales and output); unused when kDense.
template <int KIND, class AT, int BM, int BN, int WM, int WN, int BK, int STAGES, bool ALIGNED, bool ONCE,
          int GROUPED = kDense>
__global__ void __launch_bounds__(WM * WN * 32)
gemm_kernel(const AT* __restrict__ a, long long lda, const float* __restrict__ as, long long as_m, long long as_k,
            const u8* __restrict__ b, long long ldb, const float* __restrict__ bs, long long bs_n, long long bs_k,
            const void* __restrict__ bias, long long bias_s, int bias_kind, void* __restrict__ out, long long ldo,
            float* __restrict__ out_scale,
            long long os_m, long long os_n, float* ws, int* counters, u8* once_q, float* once_s, int* once_flags,
            int M, int N, int K, int block_n, int block_k, int k_split, int act, int out_kind, int out_group,
            int ue8m0_out, float eps, float a_eps, int a_ue8m0, const int* __restrict__ rows, int experts,
            long long a_e, long long as_e, long long b_e, long long bs_e, long long bias_e, long long out_e,
            long long os_e) {
  static_assert(KIND != kMmaE4M3 || __CUDA_ARCH__ >= 890, "FP8 tensor-core MMA needs sm_89 or newer");
  static_assert(!ONCE || !IsCode<AT>::value, "ONCE quantizes a float activation");
  static_assert(GROUPED == kDense || (IsCode<AT>::value && !ONCE), "grouped launches read codes");
  int m0 = blockIdx.x * BM;
  if constexpr (GROUPED != kDense) {
    const ExpertTile et = GROUPED == kMasked ? masked_tile<BM>(rows, M, blockIdx.x)
                                             : contiguous_tile<BM>(rows, experts, blockIdx.x);
    if (et.m0 >= et.count) return;  // the whole block alike, before any barrier
    const long long e = et.e, first = et.first;
    a += e * a_e + first * lda;
    as += e * as_e + first * as_m;
    b += e * b_e;
    bs += e * bs_e;
    if (bias) bias = static_cast<const char*>(bias) + e * bias_e * (bias_kind == kBiasF32 ? 4 : 2);
    out = static_cast<char*>(out) + (e * out_e + first * ldo) * out_bytes(out_kind);
    if (out_scale) out_scale += e * os_e + first * os_m;
    M = et.count;
    m0 = et.m0;
  }
  typedef Mma<KIND> MMA;
  typedef typename MMA::acc_t acc_t;
  typedef typename Select<KIND == kMmaS8, Int8, Fp8E4M3>::type Q;  // the format a float activation takes
  constexpr bool FUSED = !IsCode<AT>::value && !ONCE;  // a float activation, quantized in the prologue
  constexpr int THREADS = WM * WN * 32, WTM = BM / WM, WTN = BN / WN, MT = WTM / 16, NT = WTN / 8;
  constexpr int CPR = BN / 8, RPI = THREADS / CPR;  // epilogue: 8-column chunks per row, rows per sweep
  static_assert(WTM % 16 == 0 && NT % 2 == 0, "warp tiles are whole m16 x (2 x n8) MMA tiles");
  static_assert(THREADS % CPR == 0 && WTM % RPI == 0, "epilogue sweeps cover the warp rows evenly");

  // Shared memory: A (a ring of STAGES code tiles, or the prologue's codes and scales), then B's ring.
  extern __shared__ __align__(16) u8 smem[];
  const int ldq = FUSED ? fused_row_bytes(k_split, BK) : 0;
  const int groups = FUSED ? k_split / block_k : 0;
  u8* const sA = smem;
  float* const sS = reinterpret_cast<float*>(smem + BM * ldq);
  u8* const sB = FUSED ? smem + BM * ldq + (BM * groups * 4 + 15) / 16 * 16 : smem + STAGES * BM * BK;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.y * BN;
  const int kz0 = blockIdx.z * k_split, kz1 = min(K, kz0 + k_split);
  const int KT = (kz1 - kz0 + BK - 1) / BK;

  // ONCE: A's codes (row stride kpad, the K blocks' codes rounded up with zeros) and scales
  // (K-block-major, stride mpad) in the workspace, written by other SMs in this launch. The codes are
  // read from L2 only (a 128-byte line may hold K blocks another program has not published yet); a
  // line of scales holds one K block's only, which this program reads after it is published, so
  // they are read through L1 (from L2 they stalled each K block's promotion).
  const int kpad = (K + block_k - 1) / block_k * block_k, num_kb = kpad / block_k, mpad = (M + 31) / 32 * 32;
  const u8* const a_codes = ONCE ? once_q : reinterpret_cast<const u8*>(a);
  const float* const a_scales = ONCE ? once_s : as;
  const long long a_ld = ONCE ? kpad : lda, a_sm = ONCE ? 1 : as_m, a_sk = ONCE ? mpad : as_k;
  const RowLoader<BM, BK, THREADS, ALIGNED, ONCE> load_a(FUSED ? nullptr : a_codes, a_ld, m0, M);
  const RowLoader<BN, BK, THREADS, ALIGNED> load_b(b, ldb, n0, N);
  auto load_a_tile = [&](int kt) { load_a.load(sA + kt % STAGES * BM * BK, kz0 + kt * BK, kz1); };
  auto load_b_tile = [&](int kt) { load_b.load(sB + kt % STAGES * BN * BK, kz0 + kt * BK, kz1); };
  // ONCE: the first weight stages (one commit group each) load while the activation is quantized,
  // then A's (a group each): at iteration kt, with STAGES - 2 groups left pending, stage kt's both
  // have landed.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) {
      if constexpr (!FUSED && !ONCE) load_a_tile(s);
      load_b_tile(s);
    }
    cp_async_commit();
  }
  if constexpr (FUSED) {  // while the first weight stages load; the main loop's first barrier publishes it
    quantize_rows<Q>(a, lda, sA, ldq, sS, groups, m0, BM, M, kz0, kz1, block_k, a_eps, a_ue8m0 != 0);
  }
  if constexpr (ONCE) {
    quantize_once<Q>(a, lda, once_q, once_s, once_flags, m0, BM, M, K, kz0 / block_k, (kz1 + block_k - 1) / block_k,
                     block_k, a_eps, a_ue8m0 != 0, blockIdx.y, gridDim.y);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load_a_tile(s);
      cp_async_commit();
    }
  }

  // Scale rows of this thread's accumulator rows and columns, at K block 0 (null past M or N).
  // block_n is arbitrary, so columns of one tile may use different b_scale rows.
  const float* ap[MT][2];
  const float* bp[NT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm * WTM + mt * 16 + g + 8 * h;
      ap[mt][h] = !FUSED && m < M ? a_scales + m * a_sm : nullptr;
      if constexpr (!FUSED) pin(ap[mt][h]);
    }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = n0 + wn * WTN + nt * 8 + 2 * t + j;
      bp[nt][j] = n < N ? bs + n / block_n * bs_n : nullptr;
      pin(bp[nt][j]);
    }

  float acc[MT][NT][4];
  acc_t blk[MT][NT][4];
  float sa[MT][2], sb[NT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f, blk[mt][nt][i] = 0;

  // Position in K blocks, kept by counting (k_split is a multiple of block_k, so kz0 starts a
  // block): kin bytes of the current block are behind the step; ao and bo are its scale offsets.
  int kin = 0;
  long long ao = FUSED ? 0 : kz0 / block_k * a_sk, bo = kz0 / block_k * bs_k;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt - 1 is free to refill
    if (kt + STAGES - 1 < KT) {
      if constexpr (!FUSED) load_a_tile(kt + STAGES - 1);
      load_b_tile(kt + STAGES - 1);
    }
    cp_async_commit();
    const u8* tA = sA + (kt % STAGES) * BM * BK;
    const u8* tB = sB + (kt % STAGES) * BN * BK;

#pragma unroll
    for (int ks = 0; ks < BK / 32; ++ks) {
      const int k = kz0 + kt * BK + ks * 32;
      if (k >= kz1) break;
      if (kin == 0) {  // first step of a K block: fetch its scales, used at its end
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (FUSED) sa[mt][h] = sS[(wm * WTM + mt * 16 + g + 8 * h) * groups + ao];
            else if constexpr (ONCE) sa[mt][h] = ap[mt][h] ? __ldca(ap[mt][h] + ao) : 0.f;  // (not .nc: written in the launch)
            else sa[mt][h] = ap[mt][h] ? __ldg(ap[mt][h] + ao) : 0.f;
          }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) sb[nt][j] = bp[nt][j] ? __ldg(bp[nt][j] + bo) : 0.f;
      }

      u32 af[MT][MMA::AR];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        u32 raw[4];
        const int r = wm * WTM + mt * 16 + (lane & 15);
        if constexpr (FUSED)
          ldmatrix_x4(raw, smem_addr(sA + r * ldq + kt * BK + ks * 32 + (lane >> 4) * 16));
        else
          ldmatrix_x4(raw, smem_addr(tA + swizzle<BK>(r, ks * 2 + (lane >> 4))));
        MMA::prep_a(raw, af[mt]);
      }
#pragma unroll
      for (int np = 0; np < NT; np += 2) {
        u32 raw[4], bf0[MMA::BR], bf1[MMA::BR];
        const int r = wn * WTN + np * 8 + (lane >> 4) * 8 + (lane & 7);
        ldmatrix_x4(raw, smem_addr(tB + swizzle<BK>(r, ks * 2 + ((lane >> 3) & 1))));
        MMA::prep_b(raw[0], raw[1], bf0);
        MMA::prep_b(raw[2], raw[3], bf1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          MMA::run(blk[mt][np], af[mt], bf0);
          MMA::run(blk[mt][np + 1], af[mt], bf1);
        }
      }

      kin += 32;
      if (kin == block_k || k + 32 >= kz1) {  // last step of a K block: scale it in
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float d = __fmul_rn(__fmul_rn(MMA::dot(blk[mt][nt][i]), sa[mt][i >> 1]), sb[nt][i & 1]);
              acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], d);
              blk[mt][nt][i] = 0;
            }
        kin = 0;
        ao += FUSED ? 1 : a_sk;
        bo += bs_k;
      }
    }
  }

  // Epilogue through shared memory, one warp row at a time, so that each thread holds 8 consecutive
  // columns of a row: wide stores, and re-quantize groups on neighbouring lanes. The loops run once
  // per program and are kept rolled (finish_chunk is large).
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (ONCE) release_once(once_flags, num_kb, gridDim.x * gridDim.y * gridDim.z);
  float* const tile = reinterpret_cast<float*>(smem);
  constexpr int LDT = BN + 8;  // the padding spreads a warp's float2 writes over all banks
  auto stage_rows = [&](int pass) {  // warp row `pass` -> tile; callers synchronize around it
    if (wm == pass) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(tile + (mt * 16 + g + 8 * h) * LDT + wn * WTN + nt * 8 + 2 * t) =
                make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
    }
  };
  const int splits = gridDim.z, tile_id = blockIdx.y * gridDim.x + blockIdx.x, c = (tid % CPR) * 8;
  constexpr long long SLOT = (long long)BM * BN;  // floats per (tile, split) partial
  float* const parts = ws + (long long)tile_id * splits * SLOT;  // this tile's partials, split-major

  if (splits > 1) {
    for (int pass = 0; pass < WM; ++pass) {
      stage_rows(pass);
      __syncthreads();
#pragma unroll 1
      for (int r = tid / CPR; r < WTM; r += RPI) {
        const int row = pass * WTM + r;
        if (m0 + row < M) {
          float v[8];
          load_vec(tile + r * LDT + c, v);
          store_cg8(parts + blockIdx.z * SLOT + row * BN + c, v);
        }
      }
      __syncthreads();
    }
    // Count this split in. The barrier above ordered every thread's partial before thread 0's
    // fence, which makes them visible at GPU scope before the count; the last to count, after its
    // own fence and the barrier below, sees every split's partial.
    int last = 0;
    if (tid == 0) {
      __threadfence();
      last = atomicAdd(counters + tile_id, 1) == splits - 1;
      if (last) {
        counters[tile_id] = 0;  // every split has counted: no one touches it again in this launch
        __threadfence();
      }
    }
    if (!__syncthreads_or(last)) return;
  }

  // Finish the tile: from the registers (through shared memory), or, in the last split to count,
  // from the sum of the partials in split order 0, 1, ..., whichever split that is.
  const Epilogue e{bias, bias_s, bias_kind, out, ldo, out_scale, os_m, os_n, M, N, act, out_kind, out_group,
                   ue8m0_out, eps};
  for (int pass = 0; pass < WM; ++pass) {
    if (splits == 1) {
      stage_rows(pass);
      __syncthreads();
    }
#pragma unroll 1
    for (int r = tid / CPR; r < WTM; r += RPI) {
      const int row = pass * WTM + r;
      float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (splits == 1) {
        load_vec(tile + r * LDT + c, v);
      } else if (m0 + row < M) {
#pragma unroll 8  // loads of 8 splits in flight: one L2 round trip for most tiles
        for (int z = 0; z < splits; ++z) {
          float p[8];
          load_cg8(parts + z * SLOT + row * BN + c, p);
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = __fadd_rn(v[j], p[j]);
        }
      }
      finish_chunk(e, m0 + row, n0 + c, v);
    }
    if (splits == 1) __syncthreads();  // the next pass rewrites the tile
  }
}

}  // namespace qc
