# Extra programs of the transport tests (included from tests/CMakeLists.txt):
#   tcp_rank_main   one rank of a TCP ring across two network-namespace "hosts";
#                   run by test_tcp (TcpTwoHosts) through tests/scripts/netns_two_hosts.sh
add_executable(tcp_rank_main ${CMAKE_CURRENT_LIST_DIR}/progs/tcp_rank_main.c)
target_link_libraries(tcp_rank_main PRIVATE chorus_static chorus_internal Threads::Threads)
target_compile_options(tcp_rank_main PRIVATE ${CHORUS_WARN})
if(TARGET test_transport)
  add_dependencies(test_transport tcp_rank_main chorus_softib)
  if(TARGET chorusrun)
    add_dependencies(test_transport chorusrun)
  endif()
endif()
