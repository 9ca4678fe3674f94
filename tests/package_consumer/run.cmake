# ctest driver: install dropit from BUILD_DIR into a fresh prefix, then configure, build and run
# the consumer project against that prefix only, with the components this build can offer
# (WITH_TORCH, WITH_CUDA_EMULATED: ON when the installing build had LibTorch / the emulated device).
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix;${EXTRA_PREFIX_PATH}"
                        "-DCMAKE_CXX_COMPILER=${CXX}" "-DWITH_TORCH=${WITH_TORCH}"
                        "-DWITH_CUDA_EMULATED=${WITH_CUDA_EMULATED}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
set(programs consumer consumer_checkpoint)
if(WITH_TORCH)
  list(APPEND programs consumer_torch)
endif()
if(WITH_CUDA_EMULATED)
  list(APPEND programs consumer_cuda)
endif()
foreach(program IN LISTS programs)
  execute_process(COMMAND "${WORK_DIR}/build/${program}" RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${program} failed: ${rc}")
  endif()
endforeach()
message(STATUS "ran: ${programs}")
