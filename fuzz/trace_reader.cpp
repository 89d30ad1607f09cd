// libFuzzer target `trace_reader` (harness: trace_reader.hpp; docs/reliability.md).
#include "trace_reader.hpp"

DHISPARSE_FUZZ_TARGET(dhisparse::fuzz::trace_reader_target)
