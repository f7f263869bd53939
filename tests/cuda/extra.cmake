# Extra settings of the CUDA tests (included from tests/CMakeLists.txt). Additive: each engineer
# appends a block for their own files.
#
# CUDA path (test_cuda_ipc.cc): the transport tests' minimal communicator.
if(TARGET test_cuda)
  target_sources(test_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/transport/transport_fixture.cc)
endif()

# CUDA path: perf/cuda_copy_bw (the copy-bandwidth yardstick of perf/gpu_check.sh). Built here so
# that perf/CMakeLists.txt (the perf engineer's) needs no change; only with CUDA on.
if(CHORUS_HAVE_CUDA)
  add_executable(cuda_copy_bw ${CMAKE_SOURCE_DIR}/perf/cuda_copy_bw.cu)
  target_link_libraries(cuda_copy_bw PRIVATE CUDA::cudart)
  if(TARGET test_cuda)
    add_dependencies(test_cuda cuda_copy_bw)
  endif()
endif()
