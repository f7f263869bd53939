# tests/torch/torch.cmake: the PyTorch package (python/chorus_torch) with real torch, no mocks.
# Included from tests/CMakeLists.txt. Each test exits 77 (skipped, with a message) when no Python
# here can import torch; CI installs Debian's python3-torch (scripts/install_deps.sh).
#
#  torch_ops_{2,3}       every op of the chorus backend against gloo (chorusrun -n 2 / -n 3)
#  torch_groups_{2,3}    chorus as the default backend: async Works (wait, is_completed,
#                        futures), new_group subgroups, PREMUL_SUM, against gloo
#  torch_ddp_{2,4}       DDP over chorus, and gloo DDP with chorus_torch.allreduce_hook, reach
#                        gloo's parameters after 100 steps
#  torch_kill            a SIGKILLed rank makes the others raise with a message naming it
#  torch_destroy         20 chorus groups created and destroyed in one process leak no thread,
#                        file descriptor or shared-memory mapping
#  torch_initenv_{chorusrun,torchrun}  chorusCommInitFromEnv and the chorus backend beside
#                        torch's store on MASTER_PORT, under chorusrun and real torchrun
#  torch_example_ddp     examples/torch_ddp.py on 4096 Fashion-MNIST samples, 2 ranks
#  torch2_*              the same with CHORUS_TORCH2_PYTHON's torch, under torchrun

# The first Python that imports torch: Debian's python3-torch lives in /usr/bin/python3, which a
# pyenv or venv python3 earlier in PATH does not see.
set(CHORUS_TORCH_PYTHON "")
foreach(py python3 /usr/bin/python3)
  find_program(_chorus_py NAMES ${py} NO_CACHE)
  if(_chorus_py AND NOT CHORUS_TORCH_PYTHON)
    execute_process(COMMAND ${_chorus_py} -c "import torch" RESULT_VARIABLE _rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(_rc EQUAL 0)
      set(CHORUS_TORCH_PYTHON ${_chorus_py})
    endif()
  endif()
  unset(_chorus_py)
endforeach()
if(NOT CHORUS_TORCH_PYTHON)
  find_program(CHORUS_TORCH_PYTHON NAMES python3 NO_CACHE)
endif()

# Not in sanitizer builds: Python does not start with the sanitizer runtime first in its library
# list, so it cannot load an instrumented libchorus.so (and preloading the runtime into Python and
# torch reports their own allocations). The plain build runs them.
# A second interpreter with another torch (tests/torch/run_torch2.sh sets it to a venv with a
# pinned PyPI torch 2.x): the same tests again, named torch2_*, label torch2, every multi-rank one
# under real torchrun instead of chorusrun.
set(CHORUS_TORCH2_PYTHON "" CACHE FILEPATH
    "a Python whose torch the torch2_* tests use under torchrun (empty: none)")

# The tests for one interpreter. prefix names them (torch, torch2), launcher is chorusrun or
# torchrun (tests/torch/torchrun_launch.py) for the programs that run as N ranks.
function(chorus_torch_tests prefix py launcher)
  set(dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  if(launcher STREQUAL "torchrun")
    set(run ${py} ${dir}/torchrun_launch.py)  # + N program
    set(prog "")
  else()
    set(run $<TARGET_FILE:chorusrun> -n)       # + N python program
    set(prog ${py})
  endif()
  foreach(n 2 3)
    add_test(NAME ${prefix}_ops_${n} COMMAND ${run} ${n} ${prog} ${dir}/torch_ops.py)
  endforeach()
  foreach(n 2 3)
    add_test(NAME ${prefix}_groups_${n} COMMAND ${run} ${n} ${prog} ${dir}/torch_groups.py)
  endforeach()
  foreach(n 2 4)
    add_test(NAME ${prefix}_ddp_${n} COMMAND ${run} ${n} ${prog} ${dir}/torch_ddp.py)
  endforeach()
  add_test(NAME ${prefix}_kill COMMAND ${py} ${dir}/torch_kill.py 2)
  add_test(NAME ${prefix}_destroy COMMAND ${run} 2 ${prog} ${dir}/torch_destroy.py)
  set(tests ${prefix}_ops_2 ${prefix}_ops_3 ${prefix}_groups_2 ${prefix}_groups_3 ${prefix}_ddp_2
      ${prefix}_ddp_4 ${prefix}_kill
      ${prefix}_destroy)
  if(NOT launcher STREQUAL "torchrun")
    add_test(NAME ${prefix}_initenv_chorusrun
             COMMAND $<TARGET_FILE:chorusrun> -n 2 ${py} ${dir}/torch_initenv.py)
    list(APPEND tests ${prefix}_initenv_chorusrun)
  endif()
  # Real torchrun (torch.distributed.run), whose agent's store holds MASTER_PORT.
  add_test(NAME ${prefix}_initenv_torchrun COMMAND ${py} ${dir}/torch_initenv.py --torchrun 2)
  add_test(NAME ${prefix}_example_ddp
           COMMAND ${run} 2 ${prog} ${CMAKE_SOURCE_DIR}/examples/torch_ddp.py --backend chorus
                   --epochs 1 --limit 4096)
  set_tests_properties(${prefix}_example_ddp PROPERTIES
                       PASS_REGULAR_EXPRESSION "test accuracy [0-9.]+%.*samples/s")
  list(APPEND tests ${prefix}_initenv_torchrun ${prefix}_example_ddp)
  set_tests_properties(${tests} PROPERTIES TIMEOUT 300 LABELS "${prefix}" SKIP_RETURN_CODE 77
                       ENVIRONMENT "CHORUS_LIB=$<TARGET_FILE:chorus>;OMP_NUM_THREADS=1")
endfunction()

# Not in sanitizer builds: Python does not start with the sanitizer runtime first in its library
# list, so it cannot load an instrumented libchorus.so (and preloading the runtime into Python and
# torch reports their own allocations). The plain build runs them.
if(CHORUS_SANITIZE)
  message(STATUS "torch tests: not in a sanitizer build (CHORUS_SANITIZE=${CHORUS_SANITIZE})")
elseif(TARGET chorusrun)
  if(CHORUS_TORCH_PYTHON)
    chorus_torch_tests(torch ${CHORUS_TORCH_PYTHON} chorusrun)
  endif()
  if(CHORUS_TORCH2_PYTHON)
    chorus_torch_tests(torch2 ${CHORUS_TORCH2_PYTHON} torchrun)
  endif()
endif()
