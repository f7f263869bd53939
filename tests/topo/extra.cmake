# Two hosts as network namespaces (needs root/CAP_SYS_ADMIN; skipped otherwise): rings cross between
# the hosts twice per channel, shm inside a host, TCP between.
add_test(NAME topo.netns_two_hosts
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/netns_topology_check.sh ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(topo.netns_two_hosts PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 200 RUN_SERIAL TRUE)
