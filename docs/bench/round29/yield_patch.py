"""Round-29 probe helper: rewrite the scheduling hints of the promotion FMAs in a compiled sm_90a cubin.

ptxas 12.8 sets the yield-hint bit on nearly every FFMA of the Gluon GEMM's promotion (as on most of its
instructions) and has most of them read their scale operand from the operand reuse cache. DeepGEMM reported
(its README, "FFMA SASS interleaving") 10 %+ on block-scaled FP8 GEMMs from clearing both bits on part of each
long run of FFMAs, which by its account lets the scheduler switch warps between them (here to the other
consumer warpgroup's wgmma issue); the reuse flag goes with it, as a switch may drop the reuse cache. Neither
bit changes what an instruction computes (every output here compared bit for bit).

Works on the ELF bytes: the kernel's `.text.<name>` section, 16-byte instructions, FFMA with register
operands is opcode 0x223 in the low 12 bits (checked against nvdisasm in yield_scan.txt). Bits of the
high word: 45 the yield hint, 58-61 the operand reuse flags.
"""
import struct

FFMA_RRR = 0x223
I2FP_S32 = 0x245  # I2FP.F32.S32: the INT8 promotion converts each int32 partial before its FFMA
PROMOTION = (FFMA_RRR, I2FP_S32)
YIELD = 1 << 45
REUSE = 0xF << 58


def text_section(cubin: bytes, name: str) -> tuple[int, int]:
    """(offset, size) in `cubin` of the section `.text.<name>`."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    def header(i):
        # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size
        return struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
    strtab = header(shstrndx)[4]
    want = f".text.{name}".encode()
    for i in range(shnum):
        h = header(i)
        end = cubin.index(b"\0", strtab + h[0])
        if cubin[strtab + h[0]:end] == want:
            return h[4], h[5]
    raise KeyError(want)


def ffma_runs(cubin: bytes, name: str) -> list[list[int]]:
    """Byte offsets of the high words of the kernel's register FFMAs and I2FP.F32.S32s, in runs of
    consecutive ones."""
    off, size = text_section(cubin, name)
    runs, cur = [], []
    for pos in range(off, off + size, 16):
        lo, = struct.unpack_from("<Q", cubin, pos)
        if lo & 0xFFF in PROMOTION:
            cur.append(pos + 8)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def patched(cubin: bytes, name: str, variant: str, min_run: int = 8) -> tuple[bytes, int]:
    """`cubin` with the yield hint and reuse flags cleared on FFMAs of runs of at least `min_run`:
    variant "dg" the first 9/16 of each run (those with a reuse flag), "all" every one, "alt" every other
    one; "none" unchanged. Returns the bytes and how many instructions changed."""
    out = bytearray(cubin)
    changed = 0
    for run in ffma_runs(cubin, name):
        if variant == "none" or len(run) < min_run:
            continue
        if variant == "dg":
            picked = [p for p in run[: len(run) * 9 // 16] if struct.unpack_from("<Q", out, p)[0] & REUSE]
        elif variant == "all":
            picked = run
        elif variant == "alt":
            picked = run[::2]
        else:
            raise ValueError(variant)
        for p in picked:
            hi, = struct.unpack_from("<Q", out, p)
            new = hi & ~YIELD & ~REUSE
            if new != hi:
                struct.pack_into("<Q", out, p, new)
                changed += 1
    return bytes(out), changed
