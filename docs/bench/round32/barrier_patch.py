"""Round-32 probe helper: the Gluon GEMM with the warpgroup barriers that Triton 3.6 puts before a consumer's
mbarrier operations taken out of its PTX, as each kernel compiles (a patched `CUDABackend.make_cubin`).

VARIANT (env BARRIER_PATCH): "none"; "wait": the `bar.sync` before each `mbarrier.try_wait` (every thread waits on
the mbarrier itself, so the barrier orders nothing); "both": also the one between a `wgmma.wait_group` and the
single-thread `mbarrier.arrive` that releases a ring slot (each warp's wait sees the warpgroup's wgmma complete
before the slot is handed back: a claim about the hardware that this probe tests, not one the PTX ISA makes).
Compiled kernels are cached by source, not by PTX: give each variant its own TRITON_CACHE_DIR.
"""
import os
import re

WAIT = re.compile(r"\tbar\.sync \t\d+, 128;\n(\t// begin inline asm\n\s*\{\n\t\.reg \.pred complete;\n\twaitLoop:\n"
                  r"\tmbarrier\.try_wait)")
RELEASE = re.compile(r"(\twgmma\.wait_group\.sync\.aligned \d+;\n\t// end inline asm\n(?:\t[.a-z].*\n){0,6}?)"
                     r"\tbar\.sync \t\d+, 128;\n(\t// begin inline asm\n\t@%p\d+ mbarrier\.arrive\.shared::cta\.b64 _, )")


def patch(ptx: str, variant: str) -> tuple[str, int, int]:
    """(ptx without the variant's barriers, waits freed, releases freed)."""
    waits = releases = 0
    if variant in ("wait", "both"):
        ptx, waits = WAIT.subn(r"\1", ptx)
    if variant == "both":
        ptx, releases = RELEASE.subn(r"\1\2", ptx)
    return ptx, waits, releases


def install(variant: str = os.environ.get("BARRIER_PATCH", "none")):
    """Patch Triton's NVIDIA backend in this process so that every kernel's PTX loses the variant's barriers."""
    if variant == "none":
        return
    from triton.backends.nvidia.compiler import CUDABackend
    make_cubin = CUDABackend.make_cubin

    def patched(self, src, metadata, opt, capability):
        if "mbarrier.try_wait" in src:
            src, waits, releases = patch(src, variant)
            metadata.setdefault("barrier_patch", (waits, releases))
        return make_cubin(self, src, metadata, opt, capability)

    CUDABackend.make_cubin = patched
