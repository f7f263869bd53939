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
