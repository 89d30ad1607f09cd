// libFuzzer target `host_layout` (harness: host_layout.hpp; docs/reliability.md).
#include "host_layout.hpp"

DHISPARSE_FUZZ_TARGET(dhisparse::fuzz::host_layout_target)
