/*
 * ib_loader.c: load libibverbs at run time.
 *
 * Chorus must run on machines without RDMA software, and libnccl.so.2 must not pull libibverbs in
 * at link time, so the library is opened with dlopen (CHORUS_IB_LIBRARY when set, else
 * libibverbs.so.1, then libibverbs.so) the first time the verbs transport is asked anything.
 * Each function is looked up with dlvsym at the symbol version whose ABI <infiniband/verbs.h>
 * describes (IBVERBS_1.1, _ibv_query_gid_ex at IBVERBS_1.11), so a later libibverbs that changed a
 * function under a new version still hands us the one we were compiled for. A missing library or
 * symbol is not an error: the transport just reports no devices, and TCP carries the traffic
 * (_ibv_query_gid_ex is optional: without it the GID type comes from sysfs; so are the async
 * event calls: without them no thread watches for port errors). The handle is kept
 * for the life of the process (device contexts opened through it stay in use until exit).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "ib.h"
#include "log.h"
#include "param.h"

static ib_symbols_t g_syms;
static const ib_symbols_t *g_syms_p;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#define IB_VERSION "IBVERBS_1.1"

#define IB_SYM(field, name)                                                                        \
    do {                                                                                           \
        *(void **)(&g_syms.field) = dlvsym(handle, name, IB_VERSION);                              \
        if (g_syms.field == NULL) {                                                                \
            INFO(SUB_INIT | SUB_NET, "ib: %s lacks %s@%s: verbs transport off", lib, name,         \
                 IB_VERSION);                                                                      \
            dlclose(handle);                                                                       \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void ib_load(void) {
    const char *names[] = {"libibverbs.so.1", "libibverbs.so"};
    const char *forced = chorus_param_str(PARAM_IB_LIBRARY);
    void *handle = NULL;
    const char *lib = NULL;
    if (forced && forced[0]) {
        handle = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        lib = forced;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !handle && !lib; i++) {
        handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (handle) lib = names[i];
    }
    if (!handle) {
        INFO(SUB_INIT | SUB_NET, "ib: cannot load %s (%s): verbs transport off",
             lib ? lib : "libibverbs", dlerror());
        return;
    }
    IB_SYM(get_device_list, "ibv_get_device_list");
    IB_SYM(free_device_list, "ibv_free_device_list");
    IB_SYM(get_device_name, "ibv_get_device_name");
    IB_SYM(open_device, "ibv_open_device");
    IB_SYM(close_device, "ibv_close_device");
    IB_SYM(query_device, "ibv_query_device");
    IB_SYM(query_port, "ibv_query_port");
    IB_SYM(query_gid, "ibv_query_gid");
    IB_SYM(alloc_pd, "ibv_alloc_pd");
    IB_SYM(dealloc_pd, "ibv_dealloc_pd");
    IB_SYM(reg_mr, "ibv_reg_mr");
    IB_SYM(dereg_mr, "ibv_dereg_mr");
    IB_SYM(create_cq, "ibv_create_cq");
    IB_SYM(destroy_cq, "ibv_destroy_cq");
    IB_SYM(create_qp, "ibv_create_qp");
    IB_SYM(modify_qp, "ibv_modify_qp");
    IB_SYM(destroy_qp, "ibv_destroy_qp");
    IB_SYM(wc_status_str, "ibv_wc_status_str");
    *(void **)(&g_syms.query_gid_ex) = dlvsym(handle, "_ibv_query_gid_ex", "IBVERBS_1.11");
    *(void **)(&g_syms.get_async_event) = dlvsym(handle, "ibv_get_async_event", IB_VERSION);
    *(void **)(&g_syms.ack_async_event) = dlvsym(handle, "ibv_ack_async_event", IB_VERSION);
    if (!g_syms.ack_async_event) g_syms.get_async_event = NULL;
    INFO(SUB_INIT | SUB_NET, "ib: loaded %s%s", lib,
         g_syms.query_gid_ex ? "" : " (no _ibv_query_gid_ex: GID types from sysfs)");
    g_syms_p = &g_syms;
}

const ib_symbols_t *ib_symbols(void) {
    pthread_once(&g_once, ib_load);
    return g_syms_p;
}
