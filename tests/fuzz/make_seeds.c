/*
 * make_seeds: writes the seed corpora of tests/fuzz (valid messages and a few near misses) from the
 * real structures, so that the seeds follow the wire layout. Run from the source root after a
 * layout change:  build-fuzz/bin/fuzz_make_seeds tests/fuzz
 * The ring-order, algorithm-filter, parameter, perf-argument and topology seeds are plain text
 * files kept by hand.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bootstrap/bs_internal.h"
#include "fuzz_common.h"
#include "nccl.h"
#include "transport/shm/shm.h"
#include "transport/tcp/tcp.h"

#define FUZZ_CONN_ID 0x434f4e4e49443031ull

static const char *g_dir;

static void put(const char *harness, const char *name, const void *data, size_t len) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", g_dir, harness);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", g_dir, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static chorus_sockaddr_t addr4(const char *ip, int port) {
    chorus_sockaddr_t a;
    memset(&a, 0, sizeof(a));
    a.sin.sin_family = AF_INET;
    a.sin.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &a.sin.sin_addr);
    return a;
}

static chorus_sockaddr_t addr6(const char *ip, int port) {
    chorus_sockaddr_t a;
    memset(&a, 0, sizeof(a));
    a.sin6.sin6_family = AF_INET6;
    a.sin6.sin6_port = htons((uint16_t)port);
    inet_pton(AF_INET6, ip, &a.sin6.sin6_addr);
    return a;
}

/* A byte buffer that seeds are assembled in. */
typedef struct {
    unsigned char b[4096];
    size_t n;
} buf_t;
static void add(buf_t *o, const void *p, size_t len) {
    memcpy(o->b + o->n, p, len);
    o->n += len;
}
static void add_u8(buf_t *o, unsigned v) {
    unsigned char c = (unsigned char)v;
    add(o, &c, 1);
}

static void unique_id_seeds(void) {
    chorus_unique_id_t id;
    ncclUniqueId u;
    memset(&id, 0, sizeof(id));
    id.magic = CHORUS_ID_MAGIC;
    id.secret = fuzz_key();
    id.root = addr4("10.0.0.1", 29500);
    memset(&u, 0, sizeof(u));
    memcpy(u.internal, &id, sizeof(id));
    put("unique_id", "valid_ipv4", &u, sizeof(u));
    id.root = addr6("fe80::1", 29500);
    id.flags = CHORUS_ID_FLAG_RANK0_ROOT | CHORUS_ID_FLAG_BIND_ANY;
    memcpy(u.internal, &id, sizeof(id));
    put("unique_id", "valid_ipv6_fixed", &u, sizeof(u));
    id.flags = CHORUS_ID_FLAG_CHILD; /* sealed as split sends it: refused until opened */
    memcpy(u.internal, &id, sizeof(id));
    put("unique_id", "child_sealed", &u, sizeof(u));
    id.flags = CHORUS_ID_FLAG_RANK0_ROOT | CHORUS_ID_FLAG_BIND_ANY;
    id.root.sa.sa_family = AF_UNIX;
    memcpy(u.internal, &id, sizeof(id));
    put("unique_id", "bad_family", &u, sizeof(u));
    memset(&u, 0xff, sizeof(u));
    put("unique_id", "all_ones", &u, sizeof(u));
    /* An id of a Chorus with a 64-bit key: magic, 8-byte key, then the root address. */
    memset(&u, 0, sizeof(u));
    uint64_t old_magic = CHORUS_ID_MAGIC_V1, old_key = 0x5345435245543031ull;
    chorus_sockaddr_t old_root = addr4("10.0.0.1", 29500);
    memcpy(u.internal, &old_magic, 8);
    memcpy(u.internal + 8, &old_key, 8);
    memcpy(u.internal + 16, &old_root, sizeof(old_root));
    put("unique_id", "old_version_64bit_key", &u, sizeof(u));
}

/* Claims only: the harnesses sign them (flag) with the key and nonce they know. */
static bs_hello_t hello(uint32_t kind, int rank, int nranks, int to_rank) {
    bs_hello_t h;
    memset(&h, 0, sizeof(h));
    h.magic = BS_WIRE_MAGIC;
    h.version = BS_WIRE_VERSION;
    memset(h.nonce, 0x5a, sizeof(h.nonce));
    h.kind = kind;
    h.rank = rank;
    h.nranks = nranks;
    h.to_rank = to_rank;
    h.addr = addr4("10.0.0.2", 40000 + rank);
    return h;
}

static void bs_root_seeds(void) {
    buf_t o = {.n = 0};
    add_u8(&o, 0x80 | 3); /* signed by the harness */
    for (int r = 0; r < 3; r++) {
        bs_hello_t h = hello(BS_HELLO_ROOT, r, 3, -1);
        add(&o, &h, sizeof(h));
    }
    int32_t nranks = 3;
    add(&o, &nranks, sizeof(nranks));
    bs_answer_t ans;
    memset(&ans, 0, sizeof(ans));
    add(&o, &ans, sizeof(ans));
    bs_reply_t rep = {BS_REPLY_OK, 3, 0, 300};
    add(&o, &rep, sizeof(rep));
    put("bs_root", "three_ranks_ok", o.b, o.n);
    o.b[0] = 3; /* the same, unsigned: refused */
    put("bs_root", "three_ranks_unsigned", o.b, o.n);

    o.n = 0;
    add_u8(&o, 0x80 | 2);
    bs_hello_t h = hello(BS_HELLO_ROOT, 0, 4, -1);
    add(&o, &h, sizeof(h));
    h = hello(BS_HELLO_ROOT, 5, 4, -1);
    add(&o, &h, sizeof(h));
    nranks = 4;
    add(&o, &nranks, sizeof(nranks));
    add(&o, &ans, sizeof(ans));
    bs_reply_t tmo = {BS_REPLY_TIMEOUT, 4, 2, 300};
    add(&o, &tmo, sizeof(tmo));
    int32_t missing[2] = {2, 3};
    add(&o, missing, sizeof(missing));
    put("bs_root", "bad_rank_then_timeout", o.b, o.n);
}

static void bs_peer_seeds(void) {
    /* [nranks-1][rank][flags] hello {tag,size}+payload ... */
    buf_t o = {.n = 0};
    add_u8(&o, 3); /* 4 ranks */
    add_u8(&o, 0); /* this is rank 0 */
    add_u8(&o, 2); /* signed by the harness */
    bs_hello_t h = hello(BS_HELLO_PEER, 1, 4, 0);
    add(&o, &h, sizeof(h));
    bs_msg_hdr_t m = {BS_TAG_ALLGATHER, 0, 16};
    add(&o, &m, sizeof(m));
    add(&o, "0123456789abcdef", 16);
    bs_msg_hdr_t bar = {BS_TAG_BARRIER + 1, 0, 0};
    add(&o, &bar, sizeof(bar));
    bs_msg_hdr_t user = {7, 0, 5};
    add(&o, &user, sizeof(user));
    add(&o, "hello", 5);
    put("bs_peer", "allgather_barrier_tag", o.b, o.n);

    o.n = 0;
    add_u8(&o, 1); /* 2 ranks */
    add_u8(&o, 1);
    add_u8(&o, 2 | 1); /* signed; receive with the wrong size */
    h = hello(BS_HELLO_PEER, 0, 2, 1);
    add(&o, &h, sizeof(h));
    bs_msg_hdr_t big = {3, 0, 1ull << 40};
    add(&o, &big, sizeof(big));
    put("bs_peer", "huge_header", o.b, o.n);

    o.n = 0;
    add_u8(&o, 1);
    add_u8(&o, 1);
    add_u8(&o, 0); /* not signed: its proof is wrong */
    h = hello(BS_HELLO_PEER, 0, 2, 1);
    add(&o, &h, sizeof(h));
    put("bs_peer", "wrong_secret", o.b, o.n);

    o.n = 0;
    add_u8(&o, 1);
    add_u8(&o, 1);
    add_u8(&o, 2);
    h = hello(BS_HELLO_FROM_ROOT, -1, 2, 1);
    add(&o, &h, sizeof(h));
    bs_msg_hdr_t root = {BS_TAG_ROOT, 0, sizeof(bs_reply_t)};
    add(&o, &root, sizeof(root));
    bs_reply_t tmo = {BS_REPLY_TIMEOUT, 2, 0, 300};
    add(&o, &tmo, sizeof(tmo));
    put("bs_peer", "root_message", o.b, o.n);
}

static void tcp_seeds(void) {
    for (int is_send = 0; is_send < 2; is_send++) {
        buf_t o = {.n = 0};
        add_u8(&o, (unsigned)is_send | 2); /* signed by the harness */
        add_u8(&o, 3); /* peer */
        uint64_t slot = 1 << 20;
        add(&o, &slot, sizeof(slot));
        tcp_blob_t b;
        memset(&b, 0, sizeof(b));
        b.magic = TCP_BLOB_MAGIC;
        b.is_send = (uint32_t)!is_send;
        b.rank = 3;
        b.nslots = 8;
        b.slot_bytes = slot;
        if (is_send) {
            b.addr = addr4("10.0.0.3", 45000);
            b.conn_id = FUZZ_CONN_ID;
        } else {
            b.nsocks = 2;
        }
        add(&o, &b, sizeof(b));
        add_u8(&o, 1); /* 2 sockets */
        tcp_ack_t ack = {.magic = TCP_ACK_MAGIC};
        add(&o, &ack, sizeof(ack));
        for (uint32_t i = 0; i < 2; i++) {
            tcp_handshake_t hs = {.magic = TCP_HANDSHAKE_MAGIC,
                                  .version = TCP_WIRE_VERSION,
                                  .conn_id = FUZZ_CONN_ID,
                                  .rank = 3,
                                  .index = i,
                                  .nsocks = 2};
            add(&o, &hs, sizeof(hs));
        }
        put("tcp_handshake", is_send ? "receiver_blob_2_sockets" : "sender_blob_2_sockets", o.b,
            o.n);
    }
}

static void shm_seeds(void) {
    for (uint32_t nslots = 1; nslots <= 8; nslots *= 8) {
        shm_recv_blob_t rb;
        memset(&rb, 0, sizeof(rb));
        snprintf(rb.name, sizeof(rb.name), "/chorus-shm-1234-0123456789abcdef-n4026531836");
        rb.pid = 1234;
        rb.nslots = nslots;
        rb.slot_bytes = 1 << 19;
        rb.map_bytes = shm_ctrl_bytes((int)nslots) + nslots * rb.slot_bytes;
        static shm_ctrl_t ctrl; /* aligned */
        memset(&ctrl, 0, sizeof(ctrl));
        ctrl.magic = SHM_CTRL_MAGIC;
        ctrl.nslots = nslots;
        ctrl.slot_bytes = rb.slot_bytes;
        ctrl.data_offset = shm_ctrl_bytes((int)nslots);
        ctrl.recv_pid = 1234;
        shm_send_blob_t sb = {.pid = 4321, .pid_ns = 4026531836ull, .probe_addr = 0x7fff0000,
                              .probe_value = 42};
        static buf_t o;
        o.n = 0;
        add(&o, &rb, sizeof(rb));
        add(&o, &ctrl, sizeof(ctrl));
        add(&o, &sb, sizeof(sb));
        put("shm_blob", nslots == 1 ? "one_slot" : "eight_slots", o.b, o.n);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <tests/fuzz directory>\n", argv[0]);
        return 2;
    }
    g_dir = argv[1];
    unique_id_seeds();
    bs_root_seeds();
    bs_peer_seeds();
    tcp_seeds();
    shm_seeds();
    return 0;
}
