# tests/core/extra.cmake: core tests that are not part of the test_core gtest binary.
# Included from tests/CMakeLists.txt (include(core/extra.cmake OPTIONAL)).
#
#  core_abi_consumer_{2,4}     a C program compiled against the CUDA toolkit's own nccl.h (when
#                              the toolkit has one) and linked to build/lib/libnccl.so.2 makes,
#                              splits and destroys communicators of 2 and 4 forked ranks;
#  core_abi_consumer_chorusrun the same program started by chorusrun -n 4 (when chorusrun exists);
#  core_package_consumer       cmake --install to a temporary prefix, then a tiny project using
#                              find_package(Chorus) and pkg-config is configured, built and run.

set(CHORUS_NCCL_H_DIR "")
if(DEFINED CUDAToolkit_INCLUDE_DIRS)
  foreach(d ${CUDAToolkit_INCLUDE_DIRS})
    if(EXISTS "${d}/nccl.h" AND NOT CHORUS_NCCL_H_DIR)
      set(CHORUS_NCCL_H_DIR "${d}")
    endif()
  endforeach()
endif()
if(NOT CHORUS_NCCL_H_DIR AND EXISTS /usr/local/cuda/include/nccl.h
   AND EXISTS /usr/local/cuda/include/cuda_runtime.h)
  set(CHORUS_NCCL_H_DIR /usr/local/cuda/include)
endif()

if(CHORUS_NCCL_H_DIR)
  # Link by file, not through the `nccl` target: the target would add Chorus's include/ folder.
  add_executable(abi_consumer ${CMAKE_CURRENT_LIST_DIR}/abi_consumer/abi_consumer.c)
  target_include_directories(abi_consumer PRIVATE ${CHORUS_NCCL_H_DIR})
  target_link_libraries(abi_consumer PRIVATE $<TARGET_FILE:nccl>)
  add_dependencies(abi_consumer nccl)
  set_target_properties(abi_consumer PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
    BUILD_RPATH ${CMAKE_BINARY_DIR}/lib)
  foreach(n 2 4)
    add_test(NAME core_abi_consumer_${n} COMMAND abi_consumer ${n})
    set_tests_properties(core_abi_consumer_${n} PROPERTIES TIMEOUT 120 LABELS quick
                         ENVIRONMENT "CHORUS_TIMEOUT=60")
  endforeach()
  # gcc 12's ASan does not take its allocator lock around fork(): a child forked while the
  # parent's bootstrap root thread allocates can hang on it. abi_consumer N forks after
  # ncclGetUniqueId, as many NCCL programs do, so under ASan only its chorusrun form runs.
  if(CHORUS_SANITIZE MATCHES "address")
    set_tests_properties(core_abi_consumer_2 core_abi_consumer_4 PROPERTIES DISABLED TRUE)
  endif()
  if(TARGET chorusrun)
    # NCCL_DEBUG=VERSION tells Chorus from NVIDIA's NCCL (same version code) and says which file.
    add_test(NAME core_version_line COMMAND chorusrun -n 2 $<TARGET_FILE:abi_consumer>)
    set_tests_properties(core_version_line PROPERTIES TIMEOUT 120 LABELS quick
      ENVIRONMENT "CHORUS_TIMEOUT=60;NCCL_DEBUG=VERSION"
      PASS_REGULAR_EXPRESSION "NCCL VERSION Chorus [0-9.]+ \\(NCCL API 2\\.28\\.[0-9]+\\) from /[^ ]*libnccl\\.so")
    add_test(NAME core_abi_consumer_chorusrun COMMAND chorusrun -n 4 $<TARGET_FILE:abi_consumer>)
    set_tests_properties(core_abi_consumer_chorusrun PROPERTIES TIMEOUT 120 LABELS quick
                         ENVIRONMENT "CHORUS_TIMEOUT=60")
  endif()
else()
  message(STATUS "chorus: no toolkit nccl.h found; the ABI consumer test is skipped")
endif()

add_test(NAME core_package_consumer
         COMMAND ${CMAKE_COMMAND} -DCHORUS_BUILD_DIR=${CMAKE_BINARY_DIR} -DSANITIZE=${CHORUS_SANITIZE}
                 -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}/package_consumer
                 -DWORK_DIR=${CMAKE_BINARY_DIR}/tests/package_consumer
                 -P ${CMAKE_CURRENT_LIST_DIR}/package_consumer/run.cmake)
set_tests_properties(core_package_consumer PROPERTIES TIMEOUT 600 LABELS quick)

# chorus_info --params: every parameter with its value and where it came from.
if(TARGET chorus_info)
  add_test(NAME core_chorus_info_params COMMAND chorus_info --params)
  set_tests_properties(core_chorus_info_params PROPERTIES LABELS quick
    ENVIRONMENT "NCCL_BUFFSIZE=1M;CHORUS_NSLOTS=4"
    PASS_REGULAR_EXPRESSION "NCCL_BUFFSIZE += 1048576 +\\(env NCCL_\\).*CHORUS_NSLOTS += 4 +\\(env CHORUS_\\)")
  add_test(NAME core_chorus_info_malformed COMMAND chorus_info --params)
  set_tests_properties(core_chorus_info_malformed PROPERTIES LABELS quick
    ENVIRONMENT "CHORUS_NSLOTS=lots" WILL_FAIL TRUE)
  add_test(NAME core_chorus_info_markdown COMMAND chorus_info --params --markdown)
  set_tests_properties(core_chorus_info_markdown PROPERTIES LABELS quick
    PASS_REGULAR_EXPRESSION "^\\| Parameter \\| NCCL_ alias \\| Type \\| Default \\| Meaning \\|.*\\| `CHORUS_TIMEOUT` \\| no \\| int \\| `300` \\|")
  # docs/parameters.md is generated from the parameter table and must not fall behind it.
  add_test(NAME core_docs_parameters_in_sync
           COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/gen_param_table.sh --check ${CMAKE_BINARY_DIR})
  set_tests_properties(core_docs_parameters_in_sync PROPERTIES LABELS quick)
endif()
