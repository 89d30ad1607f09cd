/**
 * @file detail/sparse_attention/mla_consumer.cuh
 * @brief How the MLA kernel's two consumer warpgroups coordinate: the named barriers of
 *        their hand-overs, the release of a tile stage to the producer(s), and the epilogue's
 *        copy of the staged output tile to global memory in whole rows.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/cluster.cuh>
#include <dhisparse/detail/sparse_attention/mla_layout.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>

#include <cstdint>
#include <type_traits>

namespace dhisparse::sparse_attention::detail::mla {

/// Named barriers (id 0 is `__syncthreads`), each between the two consumer warpgroups.
inline constexpr int barrier_p_ready  = 1;  ///< score → value: P and the rescale factors are in shared memory
inline constexpr int barrier_p_free   = 2;  ///< value → score: P may be overwritten
inline constexpr int barrier_epilogue = 3;  ///< score → value: row sums are in shared memory
inline constexpr int barrier_output   = 4;  ///< both: the output tile is in shared memory

#if defined(__CUDACC__)

/// Barrier among the two consumer warpgroups (the producer never joins one). Both sides of
/// every hand-over wait (`bar.sync`), none only arrives: the waiting costs nothing here (the
/// other side is idle until the hand-over anyway) and every access pair is then ordered by a
/// barrier both threads took part in, which `compute-sanitizer --tool racecheck` can follow.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void consumer_sync(int id) { named_barrier_sync(id, consumers); }

/// A consumer thread is done with tile t's stage (with `Crossover` the peer's producer
/// writes into it too, so the warp also arrives on the peer's empty barrier once).
template <bool Crossover>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void release_stage(cta_work const& w, int t, int lane)
{
  mbarrier_arrive(w.empty_bar(t));
  if constexpr (Crossover) {
    __syncwarp();
    if (lane == 0) { mbarrier_arrive_remote(peer_address(smem_address(w.empty_bar(t)), cluster_rank() ^ 1)); }
  }
}

/// Copies `rows` rows of `RowBytes` from the output tile staged in shared memory (`pitch`
/// bytes apart) to global memory (`dst_pitch` bytes apart) in `Chunk`-byte pieces, consecutive
/// pieces to consecutive consumer threads (`tid` < `consumers`): whole rows per instruction.
template <int Chunk, int RowBytes>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void store_rows(unsigned char* dst, std::int64_t dst_pitch,
                                                      unsigned char const* src, int pitch, int rows, int tid)
{
  static_assert(Chunk == 16 || Chunk == 4, "16- or 4-byte pieces");
  using piece              = std::conditional_t<Chunk == 16, uint4, std::uint32_t>;
  constexpr int per_row    = RowBytes / Chunk;
  for (int c = tid; c < rows * per_row; c += consumers) {
    int const r = c / per_row;
    int const k = c - r * per_row;
    *reinterpret_cast<piece*>(dst + r * dst_pitch + Chunk * k) = *reinterpret_cast<piece const*>(src + r * pitch + Chunk * k);
  }
}

#endif  // __CUDACC__

}  // namespace dhisparse::sparse_attention::detail::mla
