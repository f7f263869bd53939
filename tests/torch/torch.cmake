# tests/torch/torch.cmake: the PyTorch package (python/chorus_torch) with real torch, no mocks.
# Included from tests/CMakeLists.txt. Each test exits 77 (skipped, with a message) when no Python
# here can import torch; CI installs Debian's python3-torch (scripts/install_deps.sh).
#
#  torch_ops_{2,3}       every op of the chorus backend against gloo (chorusrun -n 2 / -n 3)
#  torch_ddp_{2,4}       DDP over chorus, and gloo DDP with chorus_torch.allreduce_hook, reach
#                        gloo's parameters after 100 steps
#  torch_kill            a SIGKILLed rank makes the others raise with a message naming it
#  torch_initenv_{chorusrun,torchrun}  chorusCommInitFromEnv and the chorus backend beside
#                        torch's store on MASTER_PORT, under chorusrun and real torchrun
#  torch_example_ddp     examples/torch_ddp.py on 4096 Fashion-MNIST samples, 2 ranks

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
if(CHORUS_SANITIZE)
  message(STATUS "torch tests: not in a sanitizer build (CHORUS_SANITIZE=${CHORUS_SANITIZE})")
elseif(CHORUS_TORCH_PYTHON AND TARGET chorusrun)
  set(_dir ${CMAKE_CURRENT_LIST_DIR})
  set(_env "CHORUS_LIB=$<TARGET_FILE:chorus>" "OMP_NUM_THREADS=1")
  foreach(n 2 3)
    add_test(NAME torch_ops_${n}
             COMMAND $<TARGET_FILE:chorusrun> -n ${n} ${CHORUS_TORCH_PYTHON} ${_dir}/torch_ops.py)
  endforeach()
  foreach(n 2 4)
    add_test(NAME torch_ddp_${n}
             COMMAND $<TARGET_FILE:chorusrun> -n ${n} ${CHORUS_TORCH_PYTHON} ${_dir}/torch_ddp.py)
  endforeach()
  add_test(NAME torch_kill COMMAND ${CHORUS_TORCH_PYTHON} ${_dir}/torch_kill.py 2)
  add_test(NAME torch_initenv_chorusrun
           COMMAND $<TARGET_FILE:chorusrun> -n 2 ${CHORUS_TORCH_PYTHON} ${_dir}/torch_initenv.py)
  # Real torchrun (torch.distributed.run), whose agent's store holds MASTER_PORT.
  add_test(NAME torch_initenv_torchrun
           COMMAND ${CHORUS_TORCH_PYTHON} ${_dir}/torch_initenv.py --torchrun 2)
  add_test(NAME torch_example_ddp
           COMMAND $<TARGET_FILE:chorusrun> -n 2 ${CHORUS_TORCH_PYTHON}
                   ${CMAKE_SOURCE_DIR}/examples/torch_ddp.py --backend chorus --epochs 1
                   --limit 4096)
  set_tests_properties(torch_example_ddp PROPERTIES
                       PASS_REGULAR_EXPRESSION "test accuracy [0-9.]+%.*samples/s")
  set(_tests torch_ops_2 torch_ops_3 torch_ddp_2 torch_ddp_4 torch_kill torch_initenv_chorusrun
      torch_initenv_torchrun torch_example_ddp)
  set_tests_properties(${_tests} PROPERTIES TIMEOUT 300 LABELS "torch" SKIP_RETURN_CODE 77
                       ENVIRONMENT "${_env}")
  unset(_dir)
  unset(_env)
  unset(_tests)
endif()
