# run.cmake: install the build tree to a temporary prefix, then configure, build and run the
# consumer project against it (find_package(Chorus) and pkg-config). Run with cmake -P and
# -DCHORUS_BUILD_DIR=... -DCONSUMER_SOURCE_DIR=... -DWORK_DIR=...
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

run("install" ${CMAKE_COMMAND} --install ${CHORUS_BUILD_DIR} --prefix ${prefix})
foreach(f include/nccl.h include/chorus.h lib/libnccl.so.2 lib/libnccl.so lib/libchorus.so
          lib/libchorus.a lib/pkgconfig/chorus.pc lib/cmake/Chorus/ChorusConfig.cmake
          lib/cmake/Chorus/ChorusConfigVersion.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
# A sanitizer build of Chorus (-DSANITIZE=address,undefined etc.): the consumer links the same
# sanitizer, whose runtime must come first in the program's library list.
set(san_flags "")
if(SANITIZE)
  set(san_flags -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE})
endif()
run("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release ${san_flags})
run("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
set(ENV{LD_LIBRARY_PATH} ${prefix}/lib)
set(ENV{CHORUS_TIMEOUT} 60)
foreach(exe consumer_cmake consumer_pkgconfig)
  run("run ${exe}" ${WORK_DIR}/build/${exe})
  message(STATUS "${LAST_OUTPUT}")
endforeach()
