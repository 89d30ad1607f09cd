// libFuzzer target `verify_inputs` (harness: verify_inputs.hpp; docs/reliability.md).
#include "verify_inputs.hpp"

DHISPARSE_FUZZ_TARGET(dhisparse::fuzz::verify_inputs_target)
