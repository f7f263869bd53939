# Extra programs of the bootstrap tests (include from tests/CMakeLists.txt):
#   bs_rank_main   one rank of a multi-process job; run under chorusrun by test_bootstrap
#                  (ChorusRun.*) and by tests/scripts/netns_two_hosts.sh
add_executable(bs_rank_main ${CMAKE_CURRENT_LIST_DIR}/progs/bs_rank_main.c)
target_link_libraries(bs_rank_main PRIVATE chorus_static chorus_internal Threads::Threads)
target_compile_options(bs_rank_main PRIVATE ${CHORUS_WARN})
if(TARGET test_bootstrap)
  add_dependencies(test_bootstrap bs_rank_main chorusrun)
endif()
# test_bootstrap_scale.cc drives the root with the fake ranks of perf/bootstrap_fake.c.
if(TARGET test_bootstrap)
  target_link_libraries(test_bootstrap PRIVATE bs_fake)
endif()
