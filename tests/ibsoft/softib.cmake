# libchorus_softib: the software verbs provider the verbs transport's tests run on (softib.h).
# ib_loader.c opens it instead of libibverbs when CHORUS_IB_LIBRARY names it.
add_library(chorus_softib SHARED ${CMAKE_CURRENT_LIST_DIR}/softib_verbs.c
                                 ${CMAKE_CURRENT_LIST_DIR}/softib_wire.c)
target_compile_options(chorus_softib PRIVATE ${CHORUS_WARN} -fvisibility=hidden)
target_compile_definitions(chorus_softib PRIVATE _GNU_SOURCE)
target_link_libraries(chorus_softib PRIVATE Threads::Threads)
# The same symbol versions as libibverbs, so that the loader's versioned lookup (dlvsym) finds them.
target_link_options(chorus_softib PRIVATE -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/softib.map)
set_target_properties(chorus_softib PROPERTIES LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/softib.map)
# The same provider as an older libibverbs exports it (softib_old.map): no _ibv_query_gid_ex
# (IBVERBS_1.11) and no async event calls, for the loader's and the GID choice's fallbacks.
add_library(chorus_softib_old SHARED ${CMAKE_CURRENT_LIST_DIR}/softib_verbs.c
                                     ${CMAKE_CURRENT_LIST_DIR}/softib_wire.c)
target_compile_options(chorus_softib_old PRIVATE ${CHORUS_WARN} -fvisibility=hidden)
target_compile_definitions(chorus_softib_old PRIVATE _GNU_SOURCE)
target_link_libraries(chorus_softib_old PRIVATE Threads::Threads)
target_link_options(chorus_softib_old PRIVATE
                    -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/softib_old.map)
set_target_properties(chorus_softib_old PROPERTIES LINK_DEPENDS
                      ${CMAKE_CURRENT_LIST_DIR}/softib_old.map)
# The suites that run the verbs transport load the provider at run time.
foreach(t test_transport test_coll test_device)
  if(TARGET ${t})
    add_dependencies(${t} chorus_softib chorus_softib_old)
  endif()
endforeach()
