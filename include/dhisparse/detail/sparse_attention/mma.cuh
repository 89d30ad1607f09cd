/**
 * @file detail/sparse_attention/mma.cuh
 * @brief Device primitives of the sparse attention kernels: 16-byte `cp.async` with zero
 *        fill, mbarriers, named barriers, `ldmatrix`, `mma.sync` m16n8k16 (bf16 → fp32),
 *        Hopper `wgmma` (sm_90a) with 128-byte-swizzled shared-memory descriptors,
 *        `setmaxnreg`, and the proxy / operand fences.
 *
 * What libcu++'s `cuda::ptx` covers (mbarrier init / arrive / wait, `fence.proxy.async`) is
 * called from there; inline PTX is left only where `cuda::ptx` has no equivalent (CUDA 13):
 * non-bulk `cp.async` and its groups, `cp.async.mbarrier.arrive.noinc` on a shared-window
 * address (see `cp_async_mbarrier_arrive`), `setmaxnreg`, `bar.sync` with a thread count,
 * the predicated `ld.global.nc` pair, `ldmatrix`, `mma.sync`, `cvt.rn.bf16x2.f32` and `wgmma`.
 * The wrappers keep the architecture guards: a `cuda::ptx` function compiled for a target it
 * does not support is a link error, and the kernels also compile (empty) below sm_80.
 *
 * `DHISPARSE_SPARSE_ATTENTION_WGMMA` is defined in device passes compiled for sm_90a
 * (`__CUDA_ARCH_FEAT_SM90_ALL`); kernels use `wgmma` there and `mma.sync` elsewhere.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DHISPARSE_SPARSE_ATTENTION_WGMMA 1
#endif

/// True in device passes that can run the kernels (sm_80 and newer); older targets
/// compile empty kernel bodies and the launcher refuses such devices.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define DHISPARSE_SPARSE_ATTENTION_DEVICE_OK 1
#endif

#if defined(__CUDACC__)

#include <cuda/ptx>

namespace dhisparse::sparse_attention::detail {

/// Shared-memory (CTA window) address of a generic pointer to shared memory.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t smem_address(void const* ptr)
{
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

/// 16-byte global → shared copy that bypasses L1; copies zeros when `valid` is false
/// (the source is then not read, but must still be a valid address).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void cp_async_16(std::uint32_t dst, void const* src, bool valid)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  (void)dst;
  (void)src;
  (void)valid;
#endif
}

DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void cp_async_commit()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most `Pending` of this thread's committed copy groups are in flight.
template <int Pending>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void cp_async_wait()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

/// Orders this thread's generic-proxy shared-memory writes before later async-proxy
/// reads (`wgmma` operands). Needed before the barrier that publishes such writes.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void fence_proxy_async()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
#endif
}

/// Initializes the mbarrier `bar` (in shared memory) expecting `count` arrivals per phase.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void mbarrier_init(std::uint64_t* bar, std::uint32_t count)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  cuda::ptx::mbarrier_init(bar, count);
#else
  (void)bar;
  (void)count;
#endif
}

/// Arrives on an mbarrier (release semantics for this thread's prior memory accesses).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void mbarrier_arrive(std::uint64_t* bar)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  (void)cuda::ptx::mbarrier_arrive(bar);
#else
  (void)bar;
#endif
}

/// Arrives on an mbarrier once all of this thread's prior `cp.async` copies have completed
/// (the arrival counts toward the count given at initialization). Inline PTX: CUDA 13's
/// `cuda::ptx::cp_async_mbarrier_arrive_noinc` emits the instruction without `.shared`, i.e.
/// with a shared-window address as a generic one (ptxas then adds a conversion).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void cp_async_mbarrier_arrive(std::uint64_t* bar)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
#else
  (void)bar;
#endif
}

/// Waits until the phase of the mbarrier with parity `parity` has completed.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void mbarrier_wait(std::uint64_t* bar, std::uint32_t parity)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
#if __CUDA_ARCH__ >= 900
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {}
#else
  while (!cuda::ptx::mbarrier_test_wait_parity(bar, parity)) {}
#endif
#else
  (void)bar;
  (void)parity;
#endif
}

/// Lowers (`Dec`) or raises this warpgroup's per-thread register budget to `Regs` (sm_90a;
/// a no-op elsewhere). Every warp of the warpgroup must execute it.
template <bool Increase, int Regs>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void set_max_registers()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  if constexpr (Increase) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
  }
#endif
}

/// Barrier `id` (1..15) among the first `count` threads of the CTA (a multiple of 32).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void named_barrier_sync(int id, int count)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#else
  (void)id;
  (void)count;
#endif
}

/// 8 bytes at `src` and 8 bytes at `src + 256` from global memory through the non-coherent
/// path, zeros when `slot` < 0 (the addresses are then not read). `asm volatile` keeps the
/// loads where they are written: the caller issues many of them before the first use to keep
/// them in flight together.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void load_global_8x2(uint2& lo, uint2& hi, void const* src, int slot)
{
  lo = make_uint2(0, 0);
  hi = make_uint2(0, 0);
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile("{\n.reg .pred p;\nsetp.ge.s32 p, %5, 0;\n"
               "@p ld.global.nc.v2.u32 {%0, %1}, [%4];\n@p ld.global.nc.v2.u32 {%2, %3}, [%4+256];\n}\n"
               : "+r"(lo.x), "+r"(lo.y), "+r"(hi.x), "+r"(hi.y)
               : "l"(src), "r"(slot));
#else
  (void)src;
  (void)slot;
#endif
}

/// Four 8x8 b16 matrices from shared memory (each transposed when `Trans`); lane l supplies
/// the row address of matrix l / 8.
template <bool Trans>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
#else
  r[0] = r[1] = r[2] = r[3] = addr;
#endif
}

/// D[16 x 8] += A[16 x 16] * B[16 x 8], bf16 inputs, fp32 accumulators (one warp).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void mma_bf16_16816(float* d, std::uint32_t const (&a)[4],
                                                          std::uint32_t b0, std::uint32_t b1)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm volatile(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
    "{%8, %9}, {%0, %1, %2, %3};\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d;
  (void)a;
  (void)b0;
  (void)b1;
#endif
}

/// Two floats → packed bf16x2 (round to nearest even), `lo` in the low half.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t pack_bf16x2(float lo, float hi)
{
  std::uint32_t r = 0;
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
  (void)lo;
  (void)hi;
#endif
  return r;
}

/**
 * @brief `wgmma` shared-memory matrix descriptor for a 128-byte-swizzled operand.
 *
 * The operand is stored as 1024-byte atoms of 8 rows x 128 bytes, 16-byte chunk c of row r
 * at chunk position `c ^ (r % 8)` (the hardware swizzle of address bits [4,7) by [7,10)),
 * every atom 1024-byte aligned.
 * - K-major (rows = M or N, 64 K-elements per row): `lbo` unused (16), `sbo` = bytes between
 *   8-row groups; a k16 step inside the atom adds 32 bytes to the start address.
 * - MN-major (rows = K, 64 MN-elements per row): `lbo` = bytes between 64-element MN
 *   blocks, `sbo` = bytes between 8-row K groups.
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint64_t sw128_descriptor(std::uint32_t smem_addr,
                                                                     std::uint32_t lbo,
                                                                     std::uint32_t sbo)
{
  return std::uint64_t((smem_addr & 0x3FFFFu) >> 4) | (std::uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (std::uint64_t((sbo >> 4) & 0x3FFFu) << 32) | (std::uint64_t(1) << 62);
}

DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wgmma_fence()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wgmma_commit()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int Pending>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wgmma_wait()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}

/// Keeps the compiler from moving accesses of accumulator registers across `wgmma` waits.
template <int N>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void fence_registers(float (&d)[N])
{
#pragma unroll
  for (int i = 0; i < N; ++i) { asm volatile("" : "+f"(d[i])::"memory"); }
}

/// `wgmma` accumulator operands: the register list of an m64nN fp32 accumulator (N / 2
/// registers a thread) and its asm output constraints on `float d[N / 2]`.
#define DHISPARSE_WGMMA_D32_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DHISPARSE_WGMMA_D32_OUTS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DHISPARSE_WGMMA_D128_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define DHISPARSE_WGMMA_D128_OUTS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/// D[64 x 64] (+)= A[64 x 16] * B[16 x 64] on one warpgroup; A and B in shared memory
/// (descriptors), both K-major; `accumulate` = 0 overwrites D. sm_90a only.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wgmma_m64n64k16_ss(float (&d)[32], std::uint64_t desc_a,
                                                                   std::uint64_t desc_b, int accumulate)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" DHISPARSE_WGMMA_D32_REGS "}, "
               "%32, %33, p, 1, 1, 0, 0;\n}\n"
               : DHISPARSE_WGMMA_D32_OUTS(d)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)accumulate;
#endif
}

/// D[64 x 256] += A[64 x 16] * B[16 x 256] on one warpgroup; A in shared memory
/// (descriptor, K-major), B in shared memory MN-major (`tnspB` = 1). sm_90a only.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wgmma_m64n256k16_ss_bt(float (&d)[128], std::uint64_t desc_a,
                                                                       std::uint64_t desc_b)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DHISPARSE_WGMMA_D128_REGS "}, "
               "%128, %129, p, 1, 1, 0, 1;\n}\n"
               : DHISPARSE_WGMMA_D128_OUTS(d)
               : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
#endif
}

/// D[64 x 256] += A[64 x 16] * B[16 x 256] on one warpgroup; A in registers (each warp its
/// 16 rows in the `mma.sync` m16n8k16 A-fragment layout), B in shared memory MN-major
/// (`tnspB` = 1). The A registers must not change until the `wgmma` completed. sm_90a only.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wgmma_m64n256k16_rs_bt(float (&d)[128], std::uint32_t const (&a)[4],
                                                                       std::uint64_t desc_b)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DHISPARSE_WGMMA_D128_REGS "}, "
               "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
               : DHISPARSE_WGMMA_D128_OUTS(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

#undef DHISPARSE_WGMMA_D32_REGS
#undef DHISPARSE_WGMMA_D32_OUTS
#undef DHISPARSE_WGMMA_D128_REGS
#undef DHISPARSE_WGMMA_D128_OUTS

}  // namespace dhisparse::sparse_attention::detail

#endif  // __CUDACC__
