# Helpers for dhisparse's own executables (tests, examples, benchmarks). Not installed.

# Warnings and options shared by our own CUDA and C++ targets.
function(dhisparse_set_target_options target)
  target_link_libraries(${target} PRIVATE dhisparse::dhisparse)
  set_target_properties(${target} PROPERTIES
    CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr -lineinfo>)
endfunction()

# An executable built from CUDA and/or C++ sources.
function(dhisparse_add_executable target)
  add_executable(${target} ${ARGN})
  dhisparse_set_target_options(${target})
endfunction()
