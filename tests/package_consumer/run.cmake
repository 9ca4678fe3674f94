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

# What find_package says when a component cannot be had: an unknown name, and a dependency that
# is not found (nlohmann::json, hidden with CMAKE_DISABLE_FIND_PACKAGE_nlohmann_json).
file(WRITE "${WORK_DIR}/missing/CMakeLists.txt"
     "cmake_minimum_required(VERSION 3.25)\nproject(missing LANGUAGES CXX)\n"
     "find_package(dropit CONFIG REQUIRED COMPONENTS \${COMPONENT})\n")
foreach(case "bogus|unknown component 'bogus'"
             "checkpoint|component 'checkpoint' needs nlohmann::json")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 component)
  list(GET case 1 expected)
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${WORK_DIR}/missing" -B "${WORK_DIR}/missing/build-${component}"
                          -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
                          "-DCMAKE_CXX_COMPILER=${CXX}" "-DCOMPONENT=${component}"
                          -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${out}${err}" "${expected}" at)
  if(NOT rc OR at EQUAL -1)
    message(FATAL_ERROR "find_package(dropit COMPONENTS ${component}): expected a failure saying "
                        "\"${expected}\", got exit ${rc}: ${out}${err}")
  endif()
endforeach()
message(STATUS "missing components are reported")
