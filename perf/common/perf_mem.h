/*
 * perf_mem.h: the runner's view of buffer memory, streams, events and graphs (perf_mem.c).
 *
 * One interface for both memory kinds so the timing loops are written once: with host memory
 * every stream is NULL, copies are memcpy, and synchronisation is a no-op (NCCL calls on host
 * buffers return when the op is complete); with device memory these are the CUDA runtime calls.
 * In a build without CUDA the device functions fail with a message saying so.
 */
#ifndef CHORUS_PERF_MEM_H_
#define CHORUS_PERF_MEM_H_

#include <stddef.h>

#include "nccl.h"

/* Set once by the runner before any other call. */
void pm_set_device_mode(int device_mem);
int pm_device_mode(void);

int pm_cuda_built(void);
int pm_device_count(void); /* 0 without CUDA or without a GPU */
int pm_set_device(int dev);
const char *pm_error(void); /* text of the last failure */

int pm_alloc(size_t bytes, void **ptr_p); /* page-aligned host memory or device memory */
void pm_free(void *ptr);
int pm_host_alloc(size_t bytes, void **ptr_p); /* always host (staging) */
void pm_host_free(void *ptr);
/* Blocking copies between a buffer and host memory, ordered on the rank's stream (so they also
 * order against the rank's earlier and later NCCL calls) and complete on return. */
int pm_to_buf(void *dst, const void *host_src, size_t bytes, cudaStream_t s);
int pm_from_buf(void *host_dst, const void *src, size_t bytes, cudaStream_t s);
int pm_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t s);

int pm_stream_create(int null_stream, cudaStream_t *s_p);
void pm_stream_destroy(cudaStream_t s);
/* 1 done, 0 still running, -1 error. */
int pm_stream_query(cudaStream_t s);

typedef struct pm_event pm_event_t;
int pm_event_create(pm_event_t **e_p);
void pm_event_destroy(pm_event_t *e);
int pm_event_record(pm_event_t *e, cudaStream_t s);
int pm_event_elapsed_s(pm_event_t *start, pm_event_t *end, double *sec_p);

typedef struct pm_graph pm_graph_t;
int pm_graph_begin(cudaStream_t s);
int pm_graph_end(cudaStream_t s, pm_graph_t **g_p);
int pm_graph_launch(pm_graph_t *g, cudaStream_t s);
void pm_graph_destroy(pm_graph_t *g);

/* "[0000:18:00] NVIDIA H100 80GB HBM3" for a device. */
void pm_device_desc(int dev, char *buf, size_t len);
int pm_mem_info(size_t *free_p, size_t *total_p);
int pm_device_cc_major(int dev); /* compute capability major, 0 when unknown */

#endif
