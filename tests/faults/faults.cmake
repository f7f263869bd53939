# Fault-injection trials (tests/faults/fault_suite.py): fault_rank is one rank of a trial. It
# links the shared library and uses the public API only, as an application would.
add_executable(fault_rank ${CMAKE_CURRENT_LIST_DIR}/fault_rank.c)
target_link_libraries(fault_rank PRIVATE nccl Threads::Threads)
target_include_directories(fault_rank PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_compile_options(fault_rank PRIVATE ${CHORUS_WARN})
if(TARGET test_bootstrap)
  add_dependencies(test_bootstrap fault_rank) # ChorusRun.NoShmLeftAfterRanksKilledDuringConnect
endif()

# The quick fault suite (6 scenarios x 2 trials, ~35 s; CHORUS_TIMEOUT=5 inside the trials):
# SIGKILL at init, during connect and mid-op, SIGSTOP mid-op (4 ranks: the ranks not next to
# the stopped one must name it too) and during connect, over shm and TCP. Label "faults".
# The full suite (every stage x signal x transport x 2-4 ranks, link down between namespace
# hosts, 20 trials each) is run by hand: tests/faults/fault_suite.py.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME FaultSuite.Quick
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/fault_suite.py --quick
                   --timeout 5 -j 2 -b ${CMAKE_BINARY_DIR})
  set_tests_properties(FaultSuite.Quick PROPERTIES LABELS faults TIMEOUT 300)
endif()
