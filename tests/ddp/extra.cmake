# test_ddp needs the DDP layer and the example trainer's model code (MLP, IDX reader); its smoke
# tests run build/bin/ddp_mnist (and chorusrun when it is built).
if(TARGET test_ddp)
  target_link_libraries(test_ddp PRIVATE chorus_ddp ddp_mnist_model)
  if(TARGET ddp_mnist)
    add_dependencies(test_ddp ddp_mnist)
  endif()
endif()
