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
  if(DHISPARSE_ENABLE_NVTX)
    target_compile_definitions(${target} PRIVATE DHISPARSE_NVTX)
  endif()
  # DHISPARSE_SANITIZE: C++ translation units only (nvcc's host compiler is left alone), and
  # the runtime linked where the C++ compiler links (GPU executables link through nvcc and
  # get none; compute-sanitizer checks those: scripts/sanitize_gpu.sh).
  if(DHISPARSE_SANITIZE)
    set(sanitize -fsanitize=${DHISPARSE_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${sanitize}>")
    target_link_options(${target} PRIVATE "$<$<LINK_LANGUAGE:CXX>:${sanitize}>")
  endif()
endfunction()

# An executable built from CUDA and/or C++ sources.
function(dhisparse_add_executable target)
  add_executable(${target} ${ARGN})
  dhisparse_set_target_options(${target})
endfunction()
