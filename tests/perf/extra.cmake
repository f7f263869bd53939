# tests/perf/extra.cmake: extra settings for test_perf and the "perf-run" tests.
# Include from tests/CMakeLists.txt after the chorus_test_dir() calls:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/perf/extra.cmake OPTIONAL)
#
# test_perf unit-tests the harness logic in perf_core (perf/common). The perf-run tests run every
# perf binary briefly on 2 and 3 ranks (forked processes, through chorusrun when it is built,
# otherwise perf/launch_local.sh) and pass when the binary exits 0, which it does only when every
# checked element of every size was right ("# Out of bounds values : 0 OK").
if(TARGET test_perf AND TARGET perf_core)
  target_link_libraries(test_perf PRIVATE perf_core)
endif()

if(TARGET all_reduce_perf)
  if(TARGET chorusrun)
    set(CHORUS_PERF_LAUNCH $<TARGET_FILE:chorusrun> -n)
  else()
    set(CHORUS_PERF_LAUNCH ${CMAKE_SOURCE_DIR}/perf/launch_local.sh -t 120)
  endif()
  foreach(coll all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter
               sendrecv hypercube)
    foreach(np 2 3)
      if(coll STREQUAL "hypercube" AND np EQUAL 3)
        continue() # power-of-two rank counts only
      endif()
      set(name perf_run_${coll}_np${np})
      add_test(NAME ${name}
               COMMAND ${CHORUS_PERF_LAUNCH} ${np} $<TARGET_FILE:${coll}_perf>
                       -b 8 -e 1M -f 4 -c 1 -n 5 -w 1)
      set_tests_properties(${name} PROPERTIES LABELS "perf-run" TIMEOUT 180
                           ENVIRONMENT "CHORUS_TIMEOUT=60"
                           FAIL_REGULAR_EXPRESSION "FAILED;Test NCCL failure;Test CUDA failure")
    endforeach()
  endforeach()
  # Every dtype and op on 2 ranks, all-reduce only (the reduction kernels are shared).
  add_test(NAME perf_run_all_reduce_types_ops
           COMMAND ${CHORUS_PERF_LAUNCH} 2 $<TARGET_FILE:all_reduce_perf>
                   -b 8 -e 64K -f 8 -d all -o all -n 2 -w 1 -c 1)
  set_tests_properties(perf_run_all_reduce_types_ops PROPERTIES LABELS "perf-run" TIMEOUT 300
                       ENVIRONMENT "CHORUS_TIMEOUT=60")
  # Threads in one process (-t) instead of processes.
  add_test(NAME perf_run_all_reduce_threads
           COMMAND $<TARGET_FILE:all_reduce_perf> -t 3 -b 8 -e 256K -f 8 -c 1 -n 5)
  set_tests_properties(perf_run_all_reduce_threads PROPERTIES LABELS "perf-run" TIMEOUT 180
                       ENVIRONMENT "CHORUS_TIMEOUT=60")
endif()

# The comparison harness (perf/compare): its own logic without any library run, and one short
# run end to end, Chorus over shm and every peer installed on the machine (--peers all: a missing
# peer is skipped, an installed one that fails fails the test through --strict).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME perf_compare_harness
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/perf/compare/test_compare.py)
  set_tests_properties(perf_compare_harness PROPERTIES LABELS "quick;perf-run" TIMEOUT 60)
  if(TARGET all_reduce_perf)
    add_test(NAME perf_compare_smoke
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/perf/compare/compare.py --np 2
                     --colls allreduce --minbytes 8 --maxbytes 4K --factor 64 --iters 3
                     --warmup 1 --repeats 1 --rounds 2 --peers all --strict --no-chorus-tcp
                     --no-chorus-threads --timeout 120 --build ${CMAKE_BINARY_DIR}
                     --out ${CMAKE_CURRENT_BINARY_DIR}/perf_compare_smoke)
    set_tests_properties(perf_compare_smoke PROPERTIES LABELS "perf-run" TIMEOUT 600
                         ENVIRONMENT "CHORUS_TIMEOUT=60")
  endif()
endif()

# The simulator's core (perf/sim) for sim_test.cc, and one run of the program on small shapes
# (every algorithm, the tuner's choice, the markdown table).
if(TARGET test_perf AND TARGET chorus_sim_core)
  target_link_libraries(test_perf PRIVATE chorus_sim_core)
endif()
if(TARGET chorus_sim)
  add_test(NAME perf_sim_smoke
           COMMAND $<TARGET_FILE:chorus_sim> -n 8,32,96 -L 4 -b 4K -e 16M -f 16 -M -v)
  set_tests_properties(perf_sim_smoke PROPERTIES LABELS quick TIMEOUT 60
                       FAIL_REGULAR_EXPRESSION "chorus_sim: |nan")
endif()
# What an all-to-all costs each rank (perf/resources.py): 16 forked ranks through chorusrun, over
# TCP and over shared memory. Each rank's growth from init to after its last op must stay within
# 4 threads and 40 descriptors (shm: a descriptor per connection, 2 x 15 for the pairs and 4 for
# the rings of the harness's result all-gather; TCP: fewer, see below; the bootstrap connections
# the setups opened are released, 30 more if they were not; at most CHORUS_SOCKET_HELPERS helper threads and their
# eventfds for the process, none when the kernel takes every chunk at once) and 64 MB of /dev/shm
# created.
if(Python3_Interpreter_FOUND AND TARGET alltoall_perf AND TARGET chorusrun)
  add_test(NAME perf_resources_alltoall_np16
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/perf/resources.py --np 16
                   --chorusrun $<TARGET_FILE:chorusrun> --alltoall $<TARGET_FILE:alltoall_perf>
                   --maxbytes 4K --iters 2 --max-threads 4
                   --max-fds 40 --max-shm-mb 64)
  set_tests_properties(perf_resources_alltoall_np16 PROPERTIES LABELS "perf-run" TIMEOUT 600
                       ENVIRONMENT "CHORUS_TIMEOUT=120"
                       FAIL_REGULAR_EXPRESSION "FAILED;Test NCCL failure")
  # Over TCP alone, tighter: the two connections of a pair share one socket (tcp_share.c), so 15
  # sockets for the pairs, 4 for the rings, and the helpers' eventfds (34 without sharing).
  add_test(NAME perf_resources_alltoall_np16_tcp
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/perf/resources.py --np 16
                   --transports tcp
                   --chorusrun $<TARGET_FILE:chorusrun> --alltoall $<TARGET_FILE:alltoall_perf>
                   --maxbytes 4K --iters 2 --max-threads 4 --max-fds 23)
  set_tests_properties(perf_resources_alltoall_np16_tcp PROPERTIES LABELS "perf-run" TIMEOUT 600
                       ENVIRONMENT "CHORUS_TIMEOUT=120"
                       FAIL_REGULAR_EXPRESSION "FAILED;Test NCCL failure")
endif()
