// The verification kernels of test_verify_gpu, compiled once (the test's translation unit
// declares them with DHISPARSE_VERIFY_EXTERN).
#include <dhisparse/verify.cuh>

DHISPARSE_VERIFY_INSTANTIATE();
