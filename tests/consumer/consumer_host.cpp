// Consumer translation unit compiled by the C++ compiler: the host reference backend
// needs no CUDA language support.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/row_format.hpp>

#include <cstdio>

int main()
{
  dhisparse::hierarchy_config c;
  c.max_requests = c.max_batch = 1;
  c.max_top_k                  = 64;
  c.max_context                = 1024;
  c.device_slots_per_group     = 256;
  c.host.capacity_pages        = 16;
  dhisparse::host::kv_hierarchy<dhisparse::row_format::mla_fp8_656, dhisparse::policy::lru,
                                dhisparse::policy::static_budget<256>>
    h(c);
  h.admit(dhisparse::request_id{1}, 100);
  float const one = dhisparse::host::fp8_e4m3_to_float(dhisparse::fp8_e4m3{0x38});
  std::printf("consumer_host: host reference backend available (1.0 == %g, %zu request)\n", one,
              h.num_requests());
  return one == 1.0f && h.num_requests() == 1 ? 0 : 1;
}
