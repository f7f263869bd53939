/*
 * memory.c: buffer registration (ncclCommRegister/Deregister), windows
 * (ncclCommWindowRegister/Deregister), and the small CUDA helpers the core needs. ncclMemAlloc and
 * ncclMemFree are in mem_alloc.c.
 *
 * Registration is a hint in Chorus: collectives work on any buffer, registered or not. A
 * registration records the range and whether it is device memory; the handle is that record and
 * is checked when passed back. The collective engine may ask comm_reg_find whether a buffer is
 * registered. Device memory on a communicator running copy-engine programs is also exported to
 * the peers, which then read it zero-copy (devpath_register); host memory goes to the transports.
 * Windows are the same kind of record with their flags: Chorus has no symmetric kernels, so a
 * window asks nothing of the peers and registering one is a local operation, which is compatible
 * with NCCL's rule that every rank calls it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm.h"
#include "api.h"
#include "cuda_devpath.h"
#include "cuda_util.h"

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* ---- CUDA helpers --------------------------------------------------------------------------- */

int comm_cuda_current_device(void) {
#if CHORUS_HAVE_CUDA
    if (chorus_cuda_device_count() <= 0) return -1;
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return d;
#else
    return -1;
#endif
}

int comm_ptr_is_device(const void *ptr) {
#if CHORUS_HAVE_CUDA
    if (chorus_cuda_device_count() <= 0 || ptr == NULL) return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
#else
    (void)ptr;
    return 0;
#endif
}

/* ---- registrations and windows -------------------------------------------------------------- */

static ncclResult_t reg_add(struct ncclComm *comm, void *buff, size_t size, uint64_t magic,
                            int flags, comm_reg_t **rec_p) {
    comm_reg_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        WARN("out of memory for a registration");
        return ncclSystemError;
    }
    r->magic = magic;
    r->base = buff;
    r->size = size;
    r->is_device = comm_ptr_is_device(buff);
    r->win_flags = flags;
    pthread_mutex_lock(&comm->lock);
    r->next = comm->regs;
    comm->regs = r;
    pthread_mutex_unlock(&comm->lock);
    *rec_p = r;
    return ncclSuccess;
}

/* Unlink the record `handle` if it is one of this comm's records of kind `magic`. */
static int reg_remove(struct ncclComm *comm, const void *handle, uint64_t magic) {
    comm_reg_t *found = NULL;
    pthread_mutex_lock(&comm->lock);
    for (comm_reg_t **pp = &comm->regs; *pp; pp = &(*pp)->next) {
        if (*pp == handle && (*pp)->magic == magic) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&comm->lock);
    if (found == NULL) return 0;
    found->magic = 0;
    free(found);
    return 1;
}

const comm_reg_t *comm_reg_find(struct ncclComm *comm, const void *ptr, size_t bytes) {
    const comm_reg_t *hit = NULL;
    uintptr_t lo = (uintptr_t)ptr, hi = lo + bytes;
    pthread_mutex_lock(&comm->lock);
    for (const comm_reg_t *r = comm->regs; r; r = r->next) {
        uintptr_t b = (uintptr_t)r->base;
        if (lo >= b && hi <= b + r->size) {
            hit = r;
            break;
        }
    }
    pthread_mutex_unlock(&comm->lock);
    return hit;
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size,
         void **handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
    CHECK(comm_check(comm, "ncclCommRegister"));
    ARGCHECK(handle != NULL, "ncclCommRegister: handle is NULL");
    ARGCHECK(buff != NULL, "ncclCommRegister: buff is NULL");
    ARGCHECK(size > 0, "ncclCommRegister: size is 0");
    comm_reg_t *r;
    CHECK(reg_add(comm, buff, size, COMM_REG_MAGIC, 0, &r));
    /* Host memory may go over RDMA without a copy (the verbs transport maps it at first use);
     * device memory may be read zero-copy by the peers on the device path. */
    ncclResult_t tr = r->is_device || chorus_mem_kind(buff) == CHORUS_MEM_DEVICE
                          ? devpath_register(comm, buff, size)
                          : transport_buffer_register(buff, size);
    if (tr != ncclSuccess) {
        reg_remove(comm, r, COMM_REG_MAGIC);
        return tr;
    }
    INFO(SUB_REG, "rank %d registered %zu bytes of %s memory at %p", comm->rank, size,
         r->is_device ? "device" : "host", buff);
    *handle = r;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    CHECK(comm_check(comm, "ncclCommDeregister"));
    ARGCHECK(handle != NULL, "ncclCommDeregister: handle is NULL");
    /* The transports first: a range that a transfer in flight uses stays registered. */
    void *base = NULL;
    size_t size = 0;
    int device = 0;
    pthread_mutex_lock(&comm->lock);
    for (const comm_reg_t *r = comm->regs; r; r = r->next)
        if (r == handle && r->magic == COMM_REG_MAGIC) {
            base = r->base;
            size = r->size;
            device = r->is_device;
        }
    pthread_mutex_unlock(&comm->lock);
    if (base && !device && chorus_mem_kind(base) != CHORUS_MEM_DEVICE)
        CHECK(transport_buffer_deregister(base, size));
    else if (base)
        CHECK(devpath_deregister(comm, base, size));
    ARGCHECK(reg_remove(comm, handle, COMM_REG_MAGIC),
             "ncclCommDeregister: handle %p is not a registration of comm %p", handle,
             (void *)comm);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size,
         ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags) {
    CHECK(comm_check(comm, "ncclCommWindowRegister"));
    ARGCHECK(win != NULL, "ncclCommWindowRegister: win is NULL");
    ARGCHECK(buff != NULL, "ncclCommWindowRegister: buff is NULL");
    ARGCHECK(size > 0, "ncclCommWindowRegister: size is 0");
    /* 0x02 is NCCL 2.30's NCCL_WIN_STRICT_ORDERING: accepted so newer programs keep working. */
    ARGCHECK((winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | 0x02)) == 0,
             "ncclCommWindowRegister: unknown winFlags 0x%x", winFlags);
    comm_reg_t *r;
    CHECK(reg_add(comm, buff, size, COMM_WIN_MAGIC, winFlags, &r));
    INFO(SUB_REG, "rank %d registered window of %zu bytes at %p flags 0x%x", comm->rank, size, buff,
         winFlags);
    *win = (ncclWindow_t)(void *)r;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
    CHECK(comm_check(comm, "ncclCommWindowDeregister"));
    ARGCHECK(win != NULL, "ncclCommWindowDeregister: win is NULL");
    ARGCHECK(reg_remove(comm, (void *)win, COMM_WIN_MAGIC),
             "ncclCommWindowDeregister: window %p is not a window of comm %p", (void *)win,
             (void *)comm);
    return ncclSuccess;
}
