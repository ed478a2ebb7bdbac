// Round-30 probe: a block-scaled FP8 GEMM for sm_90a in CUDA C++ (nvcc 13.0), to measure what Triton 3.6's Gluon
// cannot express: 2-CTA clusters multicasting an operand through TMA. out[M,N] bf16 = sum_kb dot_kb(a,b) *
// a_s[m,kb] * b_s[n/128,kb], the contract's promotion (one FFMA an element a K block, the product a_s * b_s first),
// the same bits as the Gluon GEMM's 128x128 kernel. 128x128 tiles, 128-deep K blocks, a 6-slot TMA ring; warpgroup
// 0 produces (one thread), warpgroups 1 and 2 multiply 64 rows each (m64n128k32 wgmma, two K blocks a step, the
// second's wgmmas running while the first is promoted) on a persistent grid of one CTA per SM, in the Gluon kernel's
// grouped walk, the bf16 output through shared memory and TMA stores.
// CLUSTER: 0 a plain launch, 1 clusters of one, 2 (default) clusters of two consecutive row tiles, which share a
// column tile and so B: each CTA loads half of it for both (TMA multicast).
// Assumes M % 256 == 0, N % 128 == 0, K % 128 == 0 (no tails: a probe). The steps that led here, and the switches
// they were measured with, are in docs/performance.md (Round 30).
#include <cuda_bf16.h>
#include <stdint.h>

#define STAGES 6
#define BM 128
#define BN 128
#define BK 128
#define GROUP_M 8

#include "mc_common.cuh"

// K-major operand in 128-byte swizzled rows (TMA's SWIZZLE_128B), 8-row atoms of 1024 bytes.
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wgmma(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) : "l"(da), "l"(db), "r"(scale_d));
}

#ifndef CLUSTER
#define CLUSTER 2
#endif
#if CLUSTER == 0
// No cluster launch at all: one CTA per "cluster", as in a plain launch.
#undef CLUSTER
#define CLUSTER 1
#define CLUSTER_ATTR
#else
#define CLUSTER_ATTR __cluster_dims__(CLUSTER, 1, 1)
#endif
extern "C" __global__ void CLUSTER_ATTR __launch_bounds__(384, 1)
mc_gemm(const __grid_constant__ TMap map_a, const __grid_constant__ TMap map_b, const __grid_constant__ TMap map_c,
        // out: unused (the output goes through map_c), kept so that the arguments are the ones measured.
        const float* a_s, const float* b_s, __nv_bfloat16* __restrict__ out,
        int M, int N, int K, int stride_asm, int stride_ask, int stride_bsn, int stride_bsk) {
  extern __shared__ __align__(1024) uint8_t raw[];
  const uint32_t base = (smem_u32(raw) + 1023) & ~1023u;
  const uint32_t a_buf = base, b_buf = base + STAGES * BM * BK;
  // Per consumer warpgroup its 64x128 bf16 output: two 64x64 boxes in 128-byte swizzled rows.
  const uint32_t c_buf = b_buf + STAGES * BN * BK;
  const uint32_t full = c_buf + BM * BN * 2, empty = full + 8 * STAGES;
  // Through a shuffle from lane 0 the compiler knows it is the same across the warp: the descriptors derived from
  // it stay in uniform registers (no R2UR before each wgmma), as CUTLASS does.
  const int wg = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
#if CLUSTER == 2
  const int rank = blockIdx.x % 2;  // in the cluster
#endif
  ring_init(full, empty, STAGES, 2 * CLUSTER);
  // Tiles blockIdx.x, + gridDim.x, ... in grouped order; the CTAs of a cluster (consecutive tiles, GROUP_M even)
  // share a column tile.
  const int num_pm = M / BM, num_pn = N / BN, tiles = num_pm * num_pn, nkb = K / BK;
  const int cluster = blockIdx.x, clusters = gridDim.x;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      uint32_t s = 0, ph = 0;
      for (int t = cluster; t < tiles; t += clusters) {
        TILE_COORDS(t)
        for (int kb = 0; kb < nkb; ++kb) {
          mbar_wait(empty + 8 * s, ph ^ 1);
          mbar_expect_tx(full + 8 * s, (BM + BN) * BK);
          tma_load(a_buf + s * BM * BK, &map_a, full + 8 * s, kb * BK, m0);  // a map of 128-row boxes
#if CLUSTER == 2
          // B's map has 64-row boxes: this CTA's half, for both.
          tma_load_mc(b_buf + s * BN * BK + rank * 64 * BK, &map_b, full + 8 * s, kb * BK, n0 + rank * 64, 0x3);
#else
          tma_load(b_buf + s * BN * BK, &map_b, full + 8 * s, kb * BK, n0);  // 128-row boxes
#endif
          if (++s == STAGES) { s = 0; ph ^= 1; }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int w = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    uint32_t st = 0, ph = 0;  // the next K block's slot and its phase
    // Descriptors of slot 0 (this warpgroup's rows of A, and B); slot s is s * 16 KiB further, k32 step k 32 bytes.
    const uint64_t dA = desc(a_buf + w * 64 * BK), dB = desc(b_buf);
    float acc[64], pa[64], pb[64];
    for (int t = cluster; t < tiles; t += clusters) {
      TILE_COORDS(t)
      const int r0 = m0 + w * 64 + warp * 16 + lane / 4;
      const float* as0 = a_s + (size_t)r0 * stride_asm;
      const float* as1 = as0 + 8 * (size_t)stride_asm;
      const float* bs = b_s + (size_t)(n0 / 128) * stride_bsn;
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.f;
      // K block's wgmmas into `p` (its slot waited for first).
      auto issue = [&](float (&p)[64], uint32_t s, uint32_t phase) {
        mbar_wait(full + 8 * s, phase);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        const uint64_t da = dA + s * (BM * BK / 16), db = dB + s * (BN * BK / 16);
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma(p, da + 2 * k, db + 2 * k, k);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      };
      auto next = [&]() { if (++st == STAGES) { st = 0; ph ^= 1; } };
      // A K block complete in `p` (slot s): its slot released, `p` promoted into acc.
      auto retire = [&](float (&p)[64], uint32_t s, float s0, float s1) {
#pragma unroll
        for (int j = 0; j < 64; ++j) asm volatile("" : "+f"(p[j]) :: "memory");
        if (threadIdx.x % 128 == 0) {
          for (int c = 0; c < CLUSTER; ++c) mbar_arrive_cluster(empty + 8 * s, c);
        }
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[j] = fmaf(p[j], (j & 2) ? s1 : s0, acc[j]);
      };
      // Two K blocks a step, the second's wgmmas running while the first is promoted; none in flight across the
      // loop's back edge (ptxas would serialize every wgmma: C7514).
      int kb = 0;
      for (; kb + 2 <= nkb; kb += 2) {
        // Scales first: their loads' latency hides behind the barrier waits and the wgmmas.
        float sb0 = bs[kb * stride_bsk], sb1 = bs[(kb + 1) * stride_bsk];
        float a00 = as0[kb * stride_ask], a01 = as1[kb * stride_ask];
        float a10 = as0[(kb + 1) * stride_ask], a11 = as1[(kb + 1) * stride_ask];
        const uint32_t sa = st, pha = ph;
        next();
        const uint32_t sbb = st, phb = ph;
        next();
        issue(pa, sa, pha);
        issue(pb, sbb, phb);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        retire(pa, sa, a00 * sb0, a01 * sb0);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        retire(pb, sbb, a10 * sb1, a11 * sb1);
      }
      if (kb < nkb) {
        const float sb0 = bs[kb * stride_bsk], a00 = as0[kb * stride_ask], a01 = as1[kb * stride_ask];
        const uint32_t sa = st, pha = ph;
        next();
        issue(pa, sa, pha);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        retire(pa, sa, a00 * sb0, a01 * sb0);
      }
      {
        const uint32_t mine = c_buf + w * 64 * BN * 2;
        if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        asm volatile("bar.sync %0, 128;" :: "r"(w + 1) : "memory");
        const int q = lane % 4;
#pragma unroll
        for (int i = 0; i < 64; i += 2) {
          const int r = warp * 16 + lane / 4 + 8 * ((i >> 1) & 1), cb = i >> 2;
          __nv_bfloat162 p2 = __floats2bfloat162_rn(acc[i], acc[i + 1]);
          const uint32_t at = mine + (cb / 8) * 64 * 128 + r * 128 + (((cb % 8) ^ (r % 8)) * 16) + q * 4;
          asm volatile("st.shared.b32 [%0], %1;" :: "r"(at), "r"(*reinterpret_cast<uint32_t*>(&p2)) : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" :: "r"(w + 1) : "memory");
        if (threadIdx.x % 128 == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                         :: "l"(&map_c), "r"(n0 + 64 * h), "r"(m0 + w * 64), "r"(mine + h * 64 * 128) : "memory");
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
      }
    }
  }
  if (wg > 0 && threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  cluster_sync();
}
