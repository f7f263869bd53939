/*
 * bs_unique_id.c: making the unique id (what ncclGetUniqueId returns).
 *
 * Without CHORUS_COMM_ID/NCCL_COMM_ID: a random 256-bit key (getrandom) and the address of a
 * root thread started here, listening on an ephemeral port of the interface chorus_find_interface
 * picks. With a fixed address (NCCL_COMM_ID, or MASTER_ADDR:MASTER_PORT through
 * chorusCommInitFromEnv): the id is a pure function of the address text, so every rank computes the
 * same one on its own; nothing starts here and rank 0 runs the root inside bootstrap_init. Its
 * key is then HMAC-SHA256 of the address under the job secret (CHORUS_JOB_SECRET, or the file
 * CHORUS_JOB_SECRET_FILE), which only the job's own ranks know. Without a job secret such
 * an id is refused, because a secret derived from the address alone (what NCCL does with
 * NCCL_COMM_ID) lets any process that can reach the port join the job; CHORUS_COMM_ID_INSECURE=1
 * asks for exactly that behaviour.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bs_internal.h"
#include "check.h"
#include "param.h"
#include "sha256.h"
#include "waiter.h"

/* A random 256-bit key. No entropy source is an error: a guessable key would let anyone in. */
static ncclResult_t random_key(chorus_key_t *key, const char *what) {
    if (chorus_random_bytes(key->b, sizeof(key->b)) == 0) return ncclSuccess;
    WARN("%s: getrandom gave no random bytes (%s): cannot make an unguessable key; refusing "
         "rather than making a predictable one",
         what, strerror(errno));
    return ncclSystemError;
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

/* Labels of the HMAC-SHA256 derivations below (hashed with their terminating zero). */
#define BS_LABEL_JOB_KEY "chorus-job-key-v1"
#define BS_LABEL_INSECURE_KEY "chorus-comm-id-insecure-v1"
#define BS_LABEL_CHILD_KEY "chorus-child-key-v1"

void bootstrap_fixed_key(const char *job_secret, const char *hostport, chorus_key_t *key) {
    const char *label = job_secret ? BS_LABEL_JOB_KEY : BS_LABEL_INSECURE_KEY;
    chorus_hmac_t m;
    chorus_hmac_init(&m, job_secret, job_secret ? strlen(job_secret) : 0);
    chorus_hmac_update(&m, label, strlen(label) + 1);
    chorus_hmac_update(&m, hostport, strlen(hostport));
    chorus_hmac_final(&m, key->b);
    explicit_bzero(&m, sizeof(m));
}

/* The key of a fixed-address id: HMAC-SHA256 of the address under the job secret (so one job
 * secret reused for two addresses still keeps the jobs apart). Without a job secret: refused
 * unless CHORUS_COMM_ID_INSECURE=1, which derives it from the address alone, as NCCL does. */
static ncclResult_t fixed_id_secret(const char *hostport, const char *what, chorus_key_t *key) {
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
    if (have_text) {
        bootstrap_fixed_key(text, hostport, key);
        if (have_path) explicit_bzero(filebuf, sizeof(filebuf));
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
        WARN("CHORUS_COMM_ID_INSECURE=1: the key of the job at %s is derived from the address "
             "text, as in NCCL; it gives no secrecy: any process that can reach the port can join "
             "the job and read its data",
             hostport);
    bootstrap_fixed_key(NULL, hostport, key);
    return ncclSuccess;
}

ncclResult_t bootstrap_id_from_string(const char *hostport, const char *what,
                                      chorus_unique_id_t *id) {
    if (id == NULL) return ncclInvalidArgument;
    chorus_sockaddr_t addr;
    int is_name = 0;
    CHECK(bs_parse_hostport_ex(hostport, what ? what : "root address", &addr, &is_name));
    chorus_key_t secret;
    CHECK(fixed_id_secret(hostport, what, &secret));
    memset(id, 0, sizeof(*id));
    id->magic = CHORUS_ID_MAGIC;
    id->secret = secret;
    explicit_bzero(&secret, sizeof(secret));
    id->root = addr;
    id->flags = CHORUS_ID_FLAG_RANK0_ROOT | (is_name ? CHORUS_ID_FLAG_BIND_ANY : 0);
    char buf[64];
    INFO(SUB_BOOTSTRAP | SUB_INIT, "unique id from %s=%s: root %s (rank 0 will listen there)",
         what ? what : "address", hostport, chorus_sockaddr_str(&addr, buf, sizeof(buf)));
    return ncclSuccess;
}

/* Random key + a root thread listening on `addr` (port 0: ephemeral). */
static ncclResult_t start_root_on(const chorus_sockaddr_t *addr, const char *ifname,
                                  chorus_unique_id_t *id) {
    chorus_key_t key;
    CHECK(random_key(&key, "ncclGetUniqueId"));
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
    id->secret = key;
    id->root = bound;
    id->flags = 0;
    explicit_bzero(&key, sizeof(key));
    return bs_root_start(fd, &id->secret, &bound);
}

/* A child's key: HMAC-SHA256(parent key, label || salt || the child root's address). */
static void child_secret(const chorus_key_t *parent, const chorus_key_t *salt,
                         const chorus_sockaddr_t *root, chorus_key_t *key) {
    chorus_hmac_t m;
    chorus_hmac_init(&m, parent->b, sizeof(parent->b));
    chorus_hmac_update(&m, BS_LABEL_CHILD_KEY, sizeof(BS_LABEL_CHILD_KEY));
    chorus_hmac_update(&m, salt->b, sizeof(salt->b));
    chorus_hmac_update(&m, root, bs_sockaddr_len(root));
    chorus_hmac_final(&m, key->b);
    explicit_bzero(&m, sizeof(m));
}

ncclResult_t bootstrap_child_unique_id(const bootstrap_t *parent, chorus_unique_id_t *id,
                                       chorus_unique_id_t *wire_p) {
    if (parent == NULL || id == NULL) {
        WARN("bootstrap_child_unique_id: %s is NULL", parent ? "id" : "parent");
        return ncclInvalidArgument;
    }
    chorus_key_t salt;
    CHECK(random_key(&salt, "making a split/shrink communicator's id"));
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
    memset(id, 0, sizeof(*id));
    id->magic = CHORUS_ID_MAGIC;
    child_secret(bootstrap_secret(parent), &salt, &bound, &id->secret);
    id->root = bound;
    id->flags = 0;
    if (wire_p) {
        *wire_p = *id;
        wire_p->secret = salt;
        wire_p->flags |= CHORUS_ID_FLAG_CHILD;
    }
    return bs_root_start(fd, &id->secret, &bound);
}

void bootstrap_child_id_open(const bootstrap_t *parent, chorus_unique_id_t *id) {
    if (parent == NULL || id == NULL || !(id->flags & CHORUS_ID_FLAG_CHILD)) return;
    chorus_key_t salt = id->secret;
    child_secret(bootstrap_secret(parent), &salt, &id->root, &id->secret);
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
