# test_ddp needs the DDP layer and the example trainer's model code (MLP, IDX reader).
if(TARGET test_ddp)
  target_link_libraries(test_ddp PRIVATE chorus_ddp ddp_mnist_model)
endif()
