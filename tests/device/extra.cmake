# Extra settings of the device tests (included from tests/CMakeLists.txt).
#
# test_device_sched.cc records the steps the host engine's ring and chain schedules run: the
# binary carries its own copy of ring_common.c compiled with the trace hook on (the library's
# stays without). Linked before libchorus.a, it defines every symbol of the archive's
# ring_common.o, so that member is not pulled in.
if(TARGET test_device)
  set(chorus_ring_traced ${CMAKE_SOURCE_DIR}/src/collectives/ring_common.c)
  target_sources(test_device PRIVATE ${chorus_ring_traced})
  set_source_files_properties(${chorus_ring_traced} PROPERTIES COMPILE_DEFINITIONS CHORUS_RING_TRACE=1)
  target_include_directories(test_device PRIVATE ${CMAKE_SOURCE_DIR}/src/collectives)
endif()

# perf/devpath_enqueue: host time per device-path call on the emulator (library internals: the
# emulator's streams and memory). Built here so that perf/CMakeLists.txt (the perf engineer's)
# needs no change.
add_executable(devpath_enqueue ${CMAKE_SOURCE_DIR}/perf/devpath_enqueue.c)
target_compile_options(devpath_enqueue PRIVATE ${CHORUS_WARN})
target_link_libraries(devpath_enqueue PRIVATE chorus_static chorus_internal Threads::Threads)
if(TARGET test_device)
  add_dependencies(test_device devpath_enqueue)
endif()
add_test(NAME perf_devpath_enqueue_smoke COMMAND devpath_enqueue -r 1 -n 20)
set_tests_properties(perf_devpath_enqueue_smoke PROPERTIES LABELS quick TIMEOUT 120)
