/**
 * @file bench/serving/library_inst.cu
 * @brief The library kernels the serving benchmark launches outside the hierarchy, compiled
 *        once: FP8-656 sparse MLA attention and speculative verification.
 */
#include <dhisparse/sparse_attention.cuh>
#include <dhisparse/verify.cuh>

DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(dhisparse::row_format::mla_fp8_656);
DHISPARSE_VERIFY_INSTANTIATE();
