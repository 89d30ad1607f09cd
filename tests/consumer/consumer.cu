// Consumer translation unit compiled by nvcc: includes the whole library.
#include <dhisparse/dhisparse.cuh>

#include <cstdio>

int main()
{
  std::printf("dhisparse %d.%d.%d, mla_fp8_656 rows of %zu bytes\n", DHISPARSE_VERSION_MAJOR,
              DHISPARSE_VERSION_MINOR, DHISPARSE_VERSION_PATCH,
              dhisparse::row_format::mla_fp8_656::bytes);
  return 0;
}
