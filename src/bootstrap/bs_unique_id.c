/*
 * bs_unique_id.c: making the unique id (what ncclGetUniqueId returns).
 *
 * Without CHORUS_COMM_ID/NCCL_COMM_ID: a random 64-bit secret (getrandom) and the address of a
 * root thread started here, listening on an ephemeral port of the interface chorus_find_interface
 * picks. With a fixed address (NCCL_COMM_ID, or MASTER_ADDR:MASTER_PORT through
 * chorusCommInitFromEnv): the id is a pure function of the address text, so every rank computes the
 * same one on its own; nothing starts here and rank 0 runs the root inside bootstrap_init. Its
 * secret then comes from the job secret (CHORUS_JOB_SECRET, or the file CHORUS_JOB_SECRET_FILE),
 * which only the job's own ranks know, hashed together with the address. Without a job secret such
 * an id is refused, because a secret derived from the address alone (what NCCL does with
 * NCCL_COMM_ID) lets any process that can reach the port join the job; CHORUS_COMM_ID_INSECURE=1
 * asks for exactly that behaviour.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "sha256.h"
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

static uint64_t fnv1a(uint64_t h, const char *text, size_t len) {
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)text[i]) * 0x100000001b3ull;
    return h;
}

/* The longest job secret a file may hold (its first line). */
#define BS_JOB_SECRET_MAX 1024

/* First line of CHORUS_JOB_SECRET_FILE into buf (at least BS_JOB_SECRET_MAX + 2 bytes). The file
 * must be a regular file that neither group nor others can access: the secret is what keeps other
 * users out of the job. */
static ncclResult_t read_secret_file(const char *path, char *buf, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        WARN("CHORUS_JOB_SECRET_FILE=%s: cannot open it: %s", path, strerror(errno));
        return ncclInvalidUsage;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        WARN("CHORUS_JOB_SECRET_FILE=%s is not a regular file", path);
        close(fd);
        return ncclInvalidUsage;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        WARN("CHORUS_JOB_SECRET_FILE=%s is accessible by group or others (mode %04o): other "
             "users could read the job secret; make it private with chmod 600 %s",
             path, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return ncclInvalidUsage;
    }
    size_t got = 0;
    while (got < len - 1) {
        ssize_t n = read(fd, buf + got, len - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            WARN("CHORUS_JOB_SECRET_FILE=%s: read failed: %s", path, strerror(errno));
            close(fd);
            return ncclInvalidUsage;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
    if (n > BS_JOB_SECRET_MAX) {
        WARN("CHORUS_JOB_SECRET_FILE=%s: the secret (first line) is longer than %d bytes", path,
             BS_JOB_SECRET_MAX);
        return ncclInvalidUsage;
    }
    if (n == 0) {
        WARN("CHORUS_JOB_SECRET_FILE=%s: the first line is empty; put the job secret there", path);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* The 64-bit secret of a fixed-address id: hashed from the job secret and the address (so one job
 * secret reused for two addresses still keeps the jobs apart). Without a job secret: refused unless
 * CHORUS_COMM_ID_INSECURE=1, which derives it from the address alone, as NCCL does. */
static ncclResult_t fixed_id_secret(const char *hostport, const char *what, uint64_t *secret_p) {
    const char *text = chorus_param_str(PARAM_JOB_SECRET);
    const char *path = chorus_param_str(PARAM_JOB_SECRET_FILE);
    int have_text = text != NULL && *text != '\0';
    int have_path = path != NULL && *path != '\0';
    if (have_text && have_path) {
        WARN("CHORUS_JOB_SECRET and CHORUS_JOB_SECRET_FILE are both set: set only one");
        return ncclInvalidUsage;
    }
    if (text != NULL && !have_text) {
        WARN("CHORUS_JOB_SECRET is set but empty");
        return ncclInvalidUsage;
    }
    char filebuf[BS_JOB_SECRET_MAX + 2];
    if (have_path) {
        CHECK(read_secret_file(path, filebuf, sizeof(filebuf)));
        text = filebuf;
        have_text = 1;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    if (have_text) {
        const char *prefix = "chorus-job-secret:";
        h = fnv1a(h, prefix, strlen(prefix));
        h = fnv1a(h, text, strlen(text) + 1); /* with its NUL: secret and address stay apart */
        h = fnv1a(h, hostport, strlen(hostport));
        *secret_p = mix64(mix64(h) ^ strlen(text)) | 1;
        explicit_bzero(filebuf, sizeof(filebuf));
        return ncclSuccess;
    }
    if (chorus_param_int(PARAM_COMM_ID_INSECURE) != 1) {
        WARN("%s=%s fixes the root address but no job secret is set, so any process that can "
             "reach that port could join this job and read its data. Give every rank the same "
             "secret: CHORUS_JOB_SECRET=<random text> (e.g. from 'openssl rand -hex 32') in the "
             "environment your launcher passes on, or CHORUS_JOB_SECRET_FILE=<path of a mode "
             "0600 file>; chorusrun sets one itself on a single node. CHORUS_COMM_ID_INSECURE=1 "
             "keeps NCCL's behaviour (no secret)",
             what ? what : "the root address", hostport);
        return ncclInvalidUsage;
    }
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        WARN("CHORUS_COMM_ID_INSECURE=1: the secret of the job at %s is derived from the address "
             "text, as in NCCL; it gives no secrecy: any process that can reach the port can join "
             "the job and read its data",
             hostport);
    const char *prefix = "chorus-comm-id:";
    h = fnv1a(h, prefix, strlen(prefix));
    h = fnv1a(h, hostport, strlen(hostport));
    *secret_p = mix64(h) | 1;
    return ncclSuccess;
}

ncclResult_t bootstrap_id_from_string(const char *hostport, const char *what,
                                      chorus_unique_id_t *id) {
    if (id == NULL) return ncclInvalidArgument;
    chorus_sockaddr_t addr;
    int is_name = 0;
    CHECK(bs_parse_hostport_ex(hostport, what ? what : "root address", &addr, &is_name));
    uint64_t secret;
    CHECK(fixed_id_secret(hostport, what, &secret));
    memset(id, 0, sizeof(*id));
    id->magic = CHORUS_ID_MAGIC;
    id->secret = secret;
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

/* A child's secret: HMAC-SHA256(parent secret, label, salt, the child root's address), 64 bits. */
static uint64_t child_secret(uint64_t parent, uint64_t salt, const chorus_sockaddr_t *root) {
    static const char label[] = "chorus-child-id";
    chorus_hmac_t m;
    uint8_t mac[CHORUS_SHA256_BYTES];
    chorus_hmac_init(&m, &parent, sizeof(parent));
    chorus_hmac_update(&m, label, sizeof(label));
    chorus_hmac_update(&m, &salt, sizeof(salt));
    chorus_hmac_update(&m, root, bs_sockaddr_len(root));
    chorus_hmac_final(&m, mac);
    uint64_t secret;
    memcpy(&secret, mac, sizeof(secret));
    return secret | 1;
}

ncclResult_t bootstrap_child_unique_id(const bootstrap_t *parent, chorus_unique_id_t *id,
                                       chorus_unique_id_t *wire_p) {
    if (parent == NULL || id == NULL) {
        WARN("bootstrap_child_unique_id: %s is NULL", parent ? "id" : "parent");
        return ncclInvalidArgument;
    }
    chorus_sockaddr_t addr = *bootstrap_addr(parent, bootstrap_rank(parent));
    bs_sockaddr_set_port(&addr, 0);
    chorus_sockaddr_t bound;
    int fd;
    if (bs_listen(&addr, 0, &fd, &bound) != 0) {
        char buf[64];
        WARN("bootstrap root: cannot listen on %s (the parent's bootstrap address): %s",
             chorus_sockaddr_str(&addr, buf, sizeof(buf)), strerror(errno));
        return ncclSystemError;
    }
    uint64_t salt = random_secret();
    memset(id, 0, sizeof(*id));
    id->magic = CHORUS_ID_MAGIC;
    id->secret = child_secret(bootstrap_secret(parent), salt, &bound);
    id->root = bound;
    id->flags = 0;
    if (wire_p) {
        *wire_p = *id;
        wire_p->secret = salt;
        wire_p->flags |= CHORUS_ID_FLAG_CHILD;
    }
    return bs_root_start(fd, id->secret, &bound);
}

void bootstrap_child_id_open(const bootstrap_t *parent, chorus_unique_id_t *id) {
    if (parent == NULL || id == NULL || !(id->flags & CHORUS_ID_FLAG_CHILD)) return;
    id->secret = child_secret(bootstrap_secret(parent), id->secret, &id->root);
    id->flags &= ~CHORUS_ID_FLAG_CHILD;
}

ncclResult_t bootstrap_get_unique_id(chorus_unique_id_t *id) {
    if (id == NULL) {
        WARN("bootstrap_get_unique_id: id is NULL");
        return ncclInvalidArgument;
    }
    CHECK(chorus_param_init());
    bs_raise_nofile();
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
