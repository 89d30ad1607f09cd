// Consumer translation unit compiled by the C++ compiler: the host reference backend
// needs no CUDA language support.
#include <dhisparse/host/row_format.hpp>

#include <cstdio>

int main()
{
  float const one = dhisparse::host::fp8_e4m3_to_float(dhisparse::fp8_e4m3{0x38});
  std::printf("consumer_host: host reference backend available (1.0 == %g)\n", one);
  return one == 1.0f ? 0 : 1;
}
