// libFuzzer target `hierarchy_config` (harness: hierarchy_ops.hpp; docs/reliability.md).
#include "hierarchy_ops.hpp"

DHISPARSE_FUZZ_TARGET(dhisparse::fuzz::hierarchy_config_target)
