/*
 * fuzz_unique_id: the bytes of an ncclUniqueId as an application hands them to ncclCommInitRank.
 * An id bootstrap_id_problem rejects must make ncclCommInitRank return ncclInvalidArgument at once
 * (no socket, no thread, no crash); an id it accepts must hold a root address that can be printed
 * and connected to (IPv4 or IPv6 with a port). Accepted ids are not used: that would connect.
 */
#include <sys/socket.h>

#include "bootstrap.h"
#include "fuzz_common.h"
#include "nccl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ncclUniqueId uid;
    fuzz_input_t in = {data, size};
    fuzz_take(&in, uid.internal, sizeof(uid.internal));
    chorus_unique_id_t id;
    memcpy(&id, uid.internal, sizeof(id)); /* as comm_init_run reads it */
    const char *why = bootstrap_id_problem(&id);
    if (why != NULL) {
        FUZZ_ASSERT(why[0] != '\0');
        ncclComm_t comm = NULL;
        ncclResult_t res = ncclCommInitRank(&comm, 1, uid, 0);
        FUZZ_ASSERT(res == ncclInvalidArgument);
        if (comm != NULL) ncclCommDestroy(comm);
        return 0;
    }
    FUZZ_ASSERT(id.magic == CHORUS_ID_MAGIC);
    FUZZ_ASSERT(id.root.sa.sa_family == AF_INET || id.root.sa.sa_family == AF_INET6);
    char buf[64];
    const char *s = chorus_sockaddr_str(&id.root, buf, sizeof(buf));
    FUZZ_ASSERT(strlen(s) < sizeof(buf) && strcmp(s, "(no address)") != 0);
    return 0;
}
