/*
 * bs_unique_id.c: making the unique id (what ncclGetUniqueId returns).
 *
 * Without CHORUS_COMM_ID/NCCL_COMM_ID: a random 64-bit secret (getrandom) and the address of a
 * root thread started here, listening on an ephemeral port of the interface chorus_find_interface
 * picks. With a fixed address (NCCL_COMM_ID, or MASTER_ADDR:MASTER_PORT through
 * chorusCommInitFromEnv): the id is a pure function of the address text, so every rank computes the
 * same one on its own; nothing starts here and rank 0 runs the root inside bootstrap_init. That
 * secret is derived from public text: it keeps jobs on different addresses apart but gives no
 * secrecy, exactly as NCCL_COMM_ID does in NCCL.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "waiter.h"

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t random_secret(void) {
    uint64_t s = 0;
    size_t got = 0;
    while (got < sizeof(s)) {
        ssize_t n = getrandom((char *)&s + got, sizeof(s) - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    if (got < sizeof(s)) {
        /* No entropy source: still make ids differ between jobs (not secret, but unique). */
        s = mix64(chorus_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&s);
    }
    return s ? s : 1;
}

ncclResult_t bootstrap_id_from_string(const char *hostport, const char *what,
                                      chorus_unique_id_t *id) {
    if (id == NULL) return ncclInvalidArgument;
    chorus_sockaddr_t addr;
    int is_name = 0;
    CHECK(bs_parse_hostport_ex(hostport, what ? what : "root address", &addr, &is_name));
    memset(id, 0, sizeof(*id));
    id->magic = CHORUS_ID_MAGIC;
    /* FNV-1a over the text, then a mixer: deterministic, so all ranks agree. */
    uint64_t h = 0xcbf29ce484222325ull;
    const char *prefix = "chorus-comm-id:";
    for (const char *p = prefix; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    for (const char *p = hostport; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    id->secret = mix64(h) | 1;
    id->root = addr;
    id->flags = CHORUS_ID_FLAG_RANK0_ROOT | (is_name ? CHORUS_ID_FLAG_BIND_ANY : 0);
    char buf[64];
    INFO(SUB_BOOTSTRAP | SUB_INIT, "unique id from %s=%s: root %s (rank 0 will listen there)",
         what ? what : "address", hostport, chorus_sockaddr_str(&addr, buf, sizeof(buf)));
    return ncclSuccess;
}

/* Random secret + a root thread listening on `addr` (port 0: ephemeral). */
static ncclResult_t start_root_on(const chorus_sockaddr_t *addr, const char *ifname,
                                  chorus_unique_id_t *id) {
    chorus_sockaddr_t bound;
    int fd;
    if (bs_listen(addr, 0, &fd, &bound) != 0) {
        char buf[64];
        WARN("bootstrap root: cannot listen on %s (%s): %s",
             chorus_sockaddr_str(addr, buf, sizeof(buf)), ifname, strerror(errno));
        return ncclSystemError;
    }
    memset(id, 0, sizeof(*id));
    id->magic = CHORUS_ID_MAGIC;
    id->secret = random_secret();
    id->root = bound;
    id->flags = 0;
    return bs_root_start(fd, id->secret, &bound);
}

ncclResult_t bootstrap_child_unique_id(const bootstrap_t *parent, chorus_unique_id_t *id) {
    if (parent == NULL || id == NULL) {
        WARN("bootstrap_child_unique_id: %s is NULL", parent ? "id" : "parent");
        return ncclInvalidArgument;
    }
    chorus_sockaddr_t addr = *bootstrap_addr(parent, bootstrap_rank(parent));
    bs_sockaddr_set_port(&addr, 0);
    return start_root_on(&addr, "the parent's bootstrap address", id);
}

ncclResult_t bootstrap_get_unique_id(chorus_unique_id_t *id) {
    if (id == NULL) {
        WARN("bootstrap_get_unique_id: id is NULL");
        return ncclInvalidArgument;
    }
    CHECK(chorus_param_init());
    const char *fixed = chorus_param_str(PARAM_COMM_ID);
    if (fixed != NULL && *fixed != '\0') {
        const char *what = chorus_param_source(PARAM_COMM_ID) == PARAM_SRC_ENV_NCCL
                               ? "NCCL_COMM_ID"
                               : "CHORUS_COMM_ID";
        return bootstrap_id_from_string(fixed, what, id);
    }
    chorus_sockaddr_t addr;
    char ifname[64];
    CHECK(chorus_find_interface(&addr, ifname, sizeof(ifname)));
    return start_root_on(&addr, ifname, id);
}
