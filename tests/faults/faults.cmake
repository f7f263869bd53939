# Fault-injection trials (tests/faults/fault_suite.py): fault_rank is one rank of a trial. It
# links the shared library and uses the public API only, as an application would.
add_executable(fault_rank ${CMAKE_CURRENT_LIST_DIR}/fault_rank.c)
target_link_libraries(fault_rank PRIVATE nccl Threads::Threads)
target_include_directories(fault_rank PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_compile_options(fault_rank PRIVATE ${CHORUS_WARN})
if(TARGET test_bootstrap)
  add_dependencies(test_bootstrap fault_rank) # ChorusRun.NoShmLeftAfterRanksKilledDuringConnect
endif()
