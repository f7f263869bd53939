# install.cmake: what `cmake --install` puts in place (included by the top CMakeLists.txt).
#
#   include/            nccl.h, chorus.h (and chorus_ddp.h when present)
#   lib/                libchorus.so*, libchorus.a, libnccl.so.2.28.9 + libnccl.so.2 + libnccl.so
#   lib/cmake/Chorus/   ChorusConfig.cmake: find_package(Chorus) gives Chorus::chorus (shared),
#                       Chorus::chorus_static and Chorus::nccl
#   lib/pkgconfig/      chorus.pc (-lchorus) and nccl.pc (-lnccl), as NCCL ships one
# Programs install from their own folders (tools/, perf/, examples/).
include(CMakePackageConfigHelpers)

set(CHORUS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Chorus)

file(GLOB CHORUS_PUBLIC_HEADERS ${CMAKE_SOURCE_DIR}/include/*.h)
install(FILES ${CHORUS_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# libnccl.so has no include directory of its own in the build tree export; give it the
# installed one so that Chorus::nccl is usable like Chorus::chorus.
target_include_directories(nccl PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS chorus chorus_static nccl
        EXPORT ChorusTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT ChorusTargets NAMESPACE Chorus:: DESTINATION ${CHORUS_CMAKE_DIR})

# The static library's link interface names imported targets (hwloc through pkg-config, threads,
# CUDA's runtime when built with it): the package config finds them again for the consumer.
set(CHORUS_CONFIG_IN ${CMAKE_BINARY_DIR}/ChorusConfig.cmake.in)
file(WRITE ${CHORUS_CONFIG_IN} [=[
# ChorusConfig.cmake: find_package(Chorus) -> Chorus::chorus (shared), Chorus::chorus_static,
# Chorus::nccl (the same library under NCCL's name, libnccl.so.2).
@PACKAGE_INIT@
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(PkgConfig)
if(NOT TARGET PkgConfig::HWLOC)
  pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
endif()
set(CHORUS_HAVE_CUDA @CHORUS_HAVE_CUDA@)
if(CHORUS_HAVE_CUDA)
  find_dependency(CUDAToolkit)
endif()
include("${CMAKE_CURRENT_LIST_DIR}/ChorusTargets.cmake")
check_required_components(Chorus)
]=])
configure_package_config_file(${CHORUS_CONFIG_IN} ${CMAKE_BINARY_DIR}/ChorusConfig.cmake
                              INSTALL_DESTINATION ${CHORUS_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ChorusConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ChorusConfig.cmake ${CMAKE_BINARY_DIR}/ChorusConfigVersion.cmake
        DESTINATION ${CHORUS_CMAKE_DIR})

# pkg-config. Private requirements are for static linking (pkg-config --static).
set(CHORUS_PC_PRIVATE_LIBS "-lpthread -ldl -lrt -lm")
if(CHORUS_HAVE_CUDA)
  string(APPEND CHORUS_PC_PRIVATE_LIBS " -lcudart")
endif()
# prefix is found from the .pc file's own place (${pcfiledir}), so `cmake --install --prefix X`
# gives a correct file wherever X is.
file(RELATIVE_PATH CHORUS_PC_UP "/r/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/r")
string(REGEX REPLACE "/$" "" CHORUS_PC_UP "${CHORUS_PC_UP}")
foreach(pc chorus nccl)
  if(pc STREQUAL "chorus")
    set(PC_DESC "Chorus collective communication library (NCCL API, host and device buffers)")
    set(PC_VERSION ${PROJECT_VERSION})
  else()
    set(PC_DESC "Chorus under NCCL's name: a drop-in libnccl.so.2 (NCCL 2.28 API and ABI)")
    set(PC_VERSION 2.28.9)
  endif()
  file(WRITE ${CMAKE_BINARY_DIR}/${pc}.pc.in [=[
prefix=${pcfiledir}/@CHORUS_PC_UP@
exec_prefix=${prefix}
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@

Name: @pc@
Description: @PC_DESC@
Version: @PC_VERSION@
Requires.private: hwloc
Libs: -L${libdir} -l@pc@
Libs.private: @CHORUS_PC_PRIVATE_LIBS@
Cflags: -I${includedir}
]=])
  configure_file(${CMAKE_BINARY_DIR}/${pc}.pc.in ${CMAKE_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
