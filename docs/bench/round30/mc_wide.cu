// Probe (round 30): the block-scaled FP8 GEMM of mc_gemm.cu on Gluon's wide tile, 128x256 in 64-column
// sub-tiles (each K block four m64n64k32 wgmma groups per consumer warpgroup, each promoted while the next runs:
// an accumulator of 128 registers and two partials of 32), 4-slot TMA ring, TMA-stored bf16 output, persistent
// in Gluon's grouped walk. MULTICAST: clusters of 2 consecutive tiles (same column tile) each load half of B for both.
// Assumes M % 256 == 0 (pairs of row tiles), N % 256 == 0, K % 128 == 0, weight scales per 128 columns.
#include <cuda_bf16.h>
#include <stdint.h>

#define STAGES 4
#define BM 128
#define BN 256
#define BK 128
#define SUB 64
#define GROUP_M 8
#ifdef MULTICAST
#define CLUSTER 2
#define CLUSTER_ATTR __cluster_dims__(2, 1, 1)
#else
#define CLUSTER 1
#define CLUSTER_ATTR
#endif


#include "mc_common.cuh"

__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wgmma64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void fence_regs(float (&d)[32]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) asm volatile("" : "+f"(d[j]) :: "memory");
}

extern "C" __global__ void CLUSTER_ATTR __launch_bounds__(384, 1)
mc_wide(const __grid_constant__ TMap map_a, const __grid_constant__ TMap map_b, const __grid_constant__ TMap map_c,
        const float* a_s, const float* b_s, int M, int N, int K, int stride_asm, int stride_ask, int stride_bsn,
        int stride_bsk) {
  extern __shared__ __align__(1024) uint8_t raw[];
  const uint32_t base = (smem_u32(raw) + 1023) & ~1023u;
  const uint32_t a_buf = base, b_buf = a_buf + STAGES * BM * BK;
  // Per consumer warpgroup two 64x64 bf16 boxes (128-byte swizzled rows), taken in turn by its sub-tiles.
  const uint32_t c_buf = b_buf + STAGES * BN * BK;
  const uint32_t full = c_buf + 4 * 64 * SUB * 2, empty = full + 8 * STAGES;
  // Through a shuffle from lane 0 the compiler knows it is warp-uniform (descriptors in uniform registers).
  const int wg = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
#ifdef MULTICAST
  const int rank = blockIdx.x % 2;  // in the cluster
#endif
  ring_init(full, empty, STAGES, 2 * CLUSTER);
  const int num_pm = M / BM, num_pn = N / BN, tiles = num_pm * num_pn, nkb = K / BK;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      uint32_t s = 0, ph = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        TILE_COORDS(t)
        for (int kb = 0; kb < nkb; ++kb) {
          mbar_wait(empty + 8 * s, ph ^ 1);
          mbar_expect_tx(full + 8 * s, (BM + BN) * BK);
          tma_load(a_buf + s * BM * BK, &map_a, full + 8 * s, kb * BK, m0);
#ifdef MULTICAST
          tma_load_mc(b_buf + s * BN * BK + rank * 128 * BK, &map_b, full + 8 * s, kb * BK, n0 + rank * 128, 0x3);
#else
          tma_load(b_buf + s * BN * BK, &map_b, full + 8 * s, kb * BK, n0);
          tma_load(b_buf + s * BN * BK + 128 * BK, &map_b, full + 8 * s, kb * BK, n0 + 128);
#endif
          if (++s == STAGES) { s = 0; ph ^= 1; }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int w = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    uint32_t st = 0, ph = 0;
    const uint64_t dA = desc(a_buf + w * 64 * BK), dB = desc(b_buf);
    float acc[4][32], pa[32], pb[32];
    uint32_t epi = 0;  // this warpgroup's output boxes used so far
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      TILE_COORDS(t)
      const int r0 = m0 + w * 64 + warp * 16 + lane / 4;
      const float* as0 = a_s + (size_t)r0 * stride_asm;
      const float* as1 = as0 + 8 * (size_t)stride_asm;
      const float* bs0 = b_s + (size_t)(n0 / 128) * stride_bsn;
      const float* bs1 = bs0 + stride_bsn;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[j][i] = 0.f;
      auto issue = [&](float (&p)[32], uint32_t s, int j) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        const uint64_t da = dA + s * (BM * BK / 16), db = dB + s * (BN * BK / 16) + j * (SUB * BK / 16);
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma64(p, da + 2 * k, db + 2 * k, k);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      };
      auto promote = [&](float (&a)[32], float (&p)[32], float s0, float s1) {
        fence_regs(p);
#pragma unroll
        for (int i = 0; i < 32; ++i) a[i] = fmaf(p[i], (i & 2) ? s1 : s0, a[i]);
      };
      for (int kb = 0; kb < nkb; ++kb) {
        const float b0 = bs0[kb * stride_bsk], b1 = bs1[kb * stride_bsk];
        const float x0 = as0[kb * stride_ask], x1 = as1[kb * stride_ask];
        const uint32_t s = st;
        mbar_wait(full + 8 * s, ph);
        if (++st == STAGES) { st = 0; ph ^= 1; }
        issue(pa, s, 0);
        issue(pb, s, 1);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        promote(acc[0], pa, x0 * b0, x1 * b0);
        issue(pa, s, 2);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        promote(acc[1], pb, x0 * b0, x1 * b0);
        issue(pb, s, 3);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        promote(acc[2], pa, x0 * b1, x1 * b1);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if (threadIdx.x % 128 == 0)
          for (int c = 0; c < CLUSTER; ++c) mbar_arrive_cluster(empty + 8 * s, c);
        promote(acc[3], pb, x0 * b1, x1 * b1);
      }
      // Epilogue: per sub-tile a 64x64 bf16 box through shared memory (two per warpgroup, in turn) and a TMA store.
      const int q = lane % 4;
#pragma unroll
      for (int j = 0; j < 4; ++j, ++epi) {
        const uint32_t box = c_buf + (w * 2 + (epi & 1)) * 64 * SUB * 2;
        if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        asm volatile("bar.sync %0, 128;" :: "r"(w + 1) : "memory");
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          const int r = warp * 16 + lane / 4 + 8 * ((i >> 1) & 1), cb = i >> 2;
          __nv_bfloat162 p2 = __floats2bfloat162_rn(acc[j][i], acc[j][i + 1]);
          const uint32_t at = box + r * 128 + ((cb ^ (r % 8)) * 16) + q * 4;
          asm volatile("st.shared.b32 [%0], %1;" :: "r"(at), "r"(*reinterpret_cast<uint32_t*>(&p2)) : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" :: "r"(w + 1) : "memory");
        if (threadIdx.x % 128 == 0) {
          asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                       :: "l"(&map_c), "r"(n0 + SUB * j), "r"(m0 + w * 64), "r"(box) : "memory");
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
      }
    }
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  cluster_sync();
}
