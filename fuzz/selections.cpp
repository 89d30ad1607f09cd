// libFuzzer target `selections` (harness: hierarchy_ops.hpp; docs/reliability.md).
#include "hierarchy_ops.hpp"

DHISPARSE_FUZZ_TARGET(dhisparse::fuzz::selections_target)
