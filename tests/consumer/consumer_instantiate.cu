// The one translation unit that compiles the consumer's kv_hierarchy and its kernels.
#include <dhisparse/hierarchy.cuh>

DHISPARSE_INSTANTIATE_KV_HIERARCHY(dhisparse::row_format::mla_fp8_656, dhisparse::policy::lru,
                                   dhisparse::policy::static_budget<256>);
