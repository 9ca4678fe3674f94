# Adds the CUDA toolkit's include directories to dropit::dropit when the toolkit is installed, so that
# host code gets __half and __nv_bfloat16 (cuda_fp16.h, cuda_bf16.h) and CCCL (Thrust, CUB,
# libcu++). Nothing is linked: the host build needs these headers only, and never nvcc.
# Used in-tree (on the build interface) and by the installed package config (on the imported target).
if(NOT TARGET CUDA::toolkit)
  find_package(CUDAToolkit QUIET)
endif()
set(DROPIT_HAS_CUDA_HEADERS OFF)
if(CUDAToolkit_FOUND)
  set(_dropit_cuda_includes ${CUDAToolkit_INCLUDE_DIRS})
  # CUDA 13 keeps Thrust, CUB and libcu++ under include/cccl.
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(EXISTS "${_dir}/cccl/thrust")
      list(APPEND _dropit_cuda_includes "${_dir}/cccl")
    endif()
  endforeach()
  if(PROJECT_NAME STREQUAL "dropit" AND TARGET dropit)
    target_include_directories(dropit SYSTEM INTERFACE "$<BUILD_INTERFACE:${_dropit_cuda_includes}>")
  else()
    target_include_directories(dropit::dropit SYSTEM INTERFACE ${_dropit_cuda_includes})
  endif()
  set(DROPIT_HAS_CUDA_HEADERS ON)
endif()
