// Consumer translation unit compiled by nvcc: includes the whole library and uses a
// hierarchy instantiated in another translation unit (consumer_instantiate.cu).
#include <dhisparse/dhisparse.cuh>

#include <cstdio>

DHISPARSE_DECLARE_KV_HIERARCHY(dhisparse::row_format::mla_fp8_656, dhisparse::policy::lru,
                               dhisparse::policy::static_budget<256>);

int main()
{
  std::printf("dhisparse %d.%d.%d, mla_fp8_656 rows of %zu bytes\n", DHISPARSE_VERSION_MAJOR,
              DHISPARSE_VERSION_MINOR, DHISPARSE_VERSION_PATCH,
              dhisparse::row_format::mla_fp8_656::bytes);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) { return 0; }
  dhisparse::hierarchy_config c;
  c.max_requests = c.max_batch = 1;
  c.max_top_k                  = 64;
  c.max_context                = 1024;
  c.device_slots_per_group     = 256;
  c.host.capacity_pages        = 16;
  dhisparse::kv_hierarchy<dhisparse::row_format::mla_fp8_656, dhisparse::policy::lru,
                          dhisparse::policy::static_budget<256>>
    h(c, nullptr);
  return h.num_requests() == 0 ? 0 : 1;
}
