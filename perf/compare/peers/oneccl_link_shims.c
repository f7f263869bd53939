/*
 * oneccl_link_shims.c: the few symbols that oneccl-cpu-devel's static CPU archive (libccl.a,
 * built with Intel's compiler) takes from Intel runtime libraries the wheel does not ship, so that
 * perf/compare/oneccl_bench.cpp links with g++ alone.
 *
 * _intel_fast_memcpy and _intel_fast_memset (Intel's libirc) have glibc's meaning. The __itt_*
 * pointers are the VTune instrumentation hooks that ittnotify's macros call only when non-null:
 * left null, instrumentation stays off.
 */
#include <string.h>

void *_intel_fast_memcpy(void *dst, const void *src, size_t n);
void *_intel_fast_memset(void *dst, int c, size_t n);

void *_intel_fast_memcpy(void *dst, const void *src, size_t n) { return memcpy(dst, src, n); }
void *_intel_fast_memset(void *dst, int c, size_t n) { return memset(dst, c, n); }

void *__itt_domain_create_ptr__3_0;
void *__itt_event_create_ptr__3_0;
void *__itt_event_end_ptr__3_0;
void *__itt_event_start_ptr__3_0;
void *__itt_metadata_add_ptr__3_0;
void *__itt_string_handle_create_ptr__3_0;
void *__itt_task_begin_ptr__3_0;
void *__itt_task_end_ptr__3_0;
void *__itt_thread_set_name_ptr__3_0;
