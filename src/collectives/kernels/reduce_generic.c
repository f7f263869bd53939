/*
 * reduce_generic.c: the portable variant of the host kernels (reduce_body.h at 16-byte vectors,
 * float16 converted with integer arithmetic). It runs on any CPU the library was built for and is
 * the fallback of the dispatcher in reduce_dispatch.c.
 */
#include "reduce.h"

#define RK_VB 16
#define RK_TABLE rk_isa_generic
#define RK_TABLE_NAME "generic"
#define RK_F16C 0
#define RK_NT 0
#include "reduce_body.h"
