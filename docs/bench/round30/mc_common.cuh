// Round-30 probes' shared helpers (mc_gemm.cu, mc_wide.cu): mbarriers, TMA loads (multicast too), the cluster
// barrier, in PTX; the ring's barriers and the grouped tile walk.
#pragma once
#include <stdint.h>

// A CUtensorMap, as a __grid_constant__ kernel parameter.
struct alignas(64) TMap { uint64_t opaque[16]; };

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
__device__ __forceinline__ void tma_load(uint32_t dst, const void* map, uint32_t bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
               :: "r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_load_mc(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, uint16_t mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%3, %4}], [%2], %5;"
               :: "r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The ring's barriers: `full` takes one arrival (the producer's expect_tx), `empty` one per consumer warpgroup of every
// CTA that reads the slot (`consumers`); initialized before any CTA of the cluster may signal them.
__device__ __forceinline__ void ring_init(uint32_t full, uint32_t empty, int stages, uint32_t consumers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) { mbar_init(full + 8 * s, 1); mbar_init(empty + 8 * s, consumers); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
}

// Tile t's first row and column, m0 and n0, in grouped order (GROUP_M row tiles at a time, along the columns), from
// the including kernel's GROUP_M, BM, BN, num_pm and num_pn.
#define TILE_COORDS(t) \
    const int per = GROUP_M * num_pn, first = (t / per) * GROUP_M, size = min(num_pm - first, GROUP_M); \
    const int m0 = (first + (t % per) % size) * BM, n0 = ((t % per) / size) * BN;
