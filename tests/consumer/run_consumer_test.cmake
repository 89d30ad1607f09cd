# Configures, builds and runs the consumer project in tests/consumer, in one of two modes:
#   MODE=subdirectory  the consumer calls add_subdirectory(<dhisparse source>)
#   MODE=package       dhisparse is installed to a prefix first, the consumer calls
#                      find_package(dhisparse CONFIG REQUIRED)
foreach(var MODE SOURCE_DIR TOP_BINARY_DIR WORK_DIR GENERATOR CUDA_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: ${var} is not set")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(args -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -G ${GENERATOR}
         -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER} -DCONSUMER_MODE=${MODE})
if(MODE STREQUAL "subdirectory")
  list(APPEND args -DDHISPARSE_SOURCE_DIR=${SOURCE_DIR})
else()
  run(${CMAKE_COMMAND} --install ${TOP_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
endif()
run(${CMAKE_COMMAND} ${args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer_host)
