/*
 * setup_blob_cases.c: the checks on what a peer publishes at transport setup (shm_wire.c,
 * tcp_setup.c), case by case, in C because the transport headers use C11 atomics. Called by
 * test_setup_blobs.cc. The same functions are fuzzed by tests/fuzz/fuzz_shm_blob and
 * fuzz_tcp_handshake.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "setup_blob_cases.h"
#include "transport/shm/shm.h"
#include "transport/tcp/tcp.h"

#define EXPECT_OK(call, what)                                                                      \
    do {                                                                                           \
        if ((call) != NULL) {                                                                      \
            snprintf(fail, len, "%s: refused (%s)", what, (call));                                 \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)
#define EXPECT_REFUSED(call, what)                                                                 \
    do {                                                                                           \
        if ((call) == NULL) {                                                                      \
            snprintf(fail, len, "%s: accepted", what);                                             \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static shm_recv_blob_t good_recv_blob(void) {
    shm_recv_blob_t rb;
    memset(&rb, 0, sizeof(rb));
    snprintf(rb.name, sizeof(rb.name), "/chorus-shm-77-00112233aabbccdd-n4026531836");
    rb.pid = 77;
    rb.nslots = 8;
    rb.slot_bytes = 1 << 19;
    rb.map_bytes = shm_ctrl_bytes(8) + 8 * rb.slot_bytes;
    return rb;
}

int shm_blob_cases(char *fail, size_t len) {
    shm_recv_blob_t rb = good_recv_blob();
    EXPECT_OK(shm_recv_blob_problem(&rb), "a receiver blob as shm_setup makes it");
    rb.nslots = 0;
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "0 slots (the sender would divide by 0)");
    rb = good_recv_blob();
    rb.nslots = SHM_MAX_SLOTS + 1;
    rb.map_bytes = shm_ctrl_bytes(SHM_MAX_SLOTS + 1) + rb.nslots * rb.slot_bytes;
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "1025 slots");
    rb = good_recv_blob();
    rb.slot_bytes = 0;
    rb.map_bytes = shm_ctrl_bytes(8);
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "slots of 0 bytes");
    rb = good_recv_blob();
    rb.map_bytes = 4096; /* smaller than the control header with 8 slot headers */
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "a mapping smaller than its header");
    rb = good_recv_blob();
    rb.map_bytes -= 1;
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "a mapping one byte short of its slots");
    rb = good_recv_blob();
    memset(rb.name, 'x', sizeof(rb.name));
    memcpy(rb.name, "/chorus-shm-", 12);
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "a name without its terminating NUL");
    rb = good_recv_blob();
    snprintf(rb.name, sizeof(rb.name), "/chorus-shm-1/../../etc/passwd");
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "a name with a '/'");
    snprintf(rb.name, sizeof(rb.name), "/psm_shm.1234");
    EXPECT_REFUSED(shm_recv_blob_problem(&rb), "another program's segment");

    rb = good_recv_blob();
    static shm_ctrl_t ctrl;
    memset(&ctrl, 0, sizeof(ctrl));
    ctrl.magic = SHM_CTRL_MAGIC;
    ctrl.nslots = rb.nslots;
    ctrl.slot_bytes = rb.slot_bytes;
    ctrl.data_offset = shm_ctrl_bytes((int)rb.nslots);
    EXPECT_OK(shm_ctrl_problem(&ctrl, &rb), "a control header as shm_segment_create writes it");
    ctrl.data_offset = rb.map_bytes; /* slot 0 past the end of the mapping */
    EXPECT_REFUSED(shm_ctrl_problem(&ctrl, &rb), "a data offset past the header");
    ctrl.data_offset = shm_ctrl_bytes((int)rb.nslots);
    ctrl.slot_bytes = rb.slot_bytes * 2;
    EXPECT_REFUSED(shm_ctrl_problem(&ctrl, &rb), "slots larger than the blob's");

    shm_send_blob_t sb = {.pid = 1234};
    EXPECT_OK(shm_send_blob_problem(&sb), "a sender blob");
    sb.pid = 0;
    EXPECT_REFUSED(shm_send_blob_problem(&sb), "pid 0 (kill(0, 0) probes the process group)");
    sb.pid = 0xffffffffu;
    EXPECT_REFUSED(shm_send_blob_problem(&sb), "pid -1 (kill(-1, 0) probes every process)");
    return 0;
}

#define EXPECT_BLOB(ok, b, is_send, slot, what)                                                    \
    do {                                                                                           \
        char why[160];                                                                             \
        int rc = tcp_blob_problem(&(b), is_send, 3, slot, why, sizeof(why));                       \
        if ((rc == 0) != (ok)) {                                                                   \
            snprintf(fail, len, "%s: %s", what, rc == 0 ? "accepted" : why);                       \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

int tcp_blob_cases(char *fail, size_t len) {
    tcp_blob_t recv_blob; /* what a receiver publishes, read by the sender (is_send = 1) */
    memset(&recv_blob, 0, sizeof(recv_blob));
    recv_blob.magic = TCP_BLOB_MAGIC;
    recv_blob.is_send = 0;
    recv_blob.rank = 3;
    recv_blob.slot_bytes = 1 << 20;
    recv_blob.addr.sin.sin_family = AF_INET;
    recv_blob.addr.sin.sin_port = htons(5000);
    EXPECT_BLOB(1, recv_blob, 1, 1 << 20, "a receiver blob");
    tcp_blob_t b = recv_blob;
    b.addr.sa.sa_family = AF_UNIX;
    EXPECT_BLOB(0, b, 1, 1 << 20, "a receiver address that is not IP");
    b = recv_blob;
    b.slot_bytes = 1 << 10;
    EXPECT_BLOB(0, b, 1, 1 << 20, "receiver slots smaller than ours");
    b = recv_blob;
    b.rank = 4;
    EXPECT_BLOB(0, b, 1, 1 << 20, "a blob from another rank");
    EXPECT_BLOB(0, recv_blob, 0, 1 << 20, "a receiver blob read by a receiver");

    tcp_blob_t send_blob;
    memset(&send_blob, 0, sizeof(send_blob));
    send_blob.magic = TCP_BLOB_MAGIC;
    send_blob.is_send = 1;
    send_blob.rank = 3;
    send_blob.nsocks = 2;
    send_blob.slot_bytes = 1 << 20;
    EXPECT_BLOB(1, send_blob, 0, 1 << 20, "a sender blob");
    b = send_blob;
    b.nsocks = 0;
    EXPECT_BLOB(0, b, 0, 1 << 20, "0 sockets");
    b.nsocks = TCP_MAX_SOCKS + 1;
    EXPECT_BLOB(0, b, 0, 1 << 20, "65 sockets");
    b = send_blob;
    b.slot_bytes = 1 << 21;
    EXPECT_BLOB(0, b, 0, 1 << 20, "sender chunks larger than our slots");

    /* The handshake answers the receiver's challenge c with a proof keyed by the secret k5 (a
     * 256-bit key); k4 differs from it in its last byte only. */
    chorus_key_t k5, k4;
    for (int i = 0; i < CHORUS_KEY_BYTES; i++)
        k5.b[i] = (uint8_t)(0x50 + i);
    k4 = k5;
    k4.b[CHORUS_KEY_BYTES - 1] ^= 1;
    tcp_challenge_t c, other;
    if (tcp_challenge_make(&c) != 0 || tcp_challenge_make(&other) != 0) {
        snprintf(fail, len, "no random bytes for a challenge");
        return -1;
    }
    tcp_handshake_t hs;
    memset(&hs, 0, sizeof(hs));
    hs.conn_id = 6;
    hs.rank = 3;
    hs.index = 1;
    hs.nsocks = 2;
    tcp_handshake_sign(&hs, &k5, &c);
    EXPECT_OK(tcp_handshake_problem(&hs, &k5, c.nonce, 6, 3, 2), "a handshake");
    EXPECT_REFUSED(tcp_handshake_problem(&hs, &k4, c.nonce, 6, 3, 2), "a wrong secret");
    EXPECT_REFUSED(tcp_handshake_problem(&hs, &k5, other.nonce, 6, 3, 2),
                   "a handshake replayed on another connection");
    /* A peer that knows only the key's first 64 bits (what a 64-bit key held): signing with them
     * as an 8-byte key, or with the rest zeroed, is refused. */
    tcp_handshake_t h64 = hs;
    chorus_auth_proof(k5.b, 8, TCP_AUTH_LABEL, CHORUS_AUTH_CLIENT, h64.nonce, c.nonce, &h64,
                      TCP_HANDSHAKE_CLAIMS, NULL, 0, h64.proof);
    EXPECT_REFUSED(tcp_handshake_problem(&h64, &k5, c.nonce, 6, 3, 2),
                   "a handshake keyed by the key's first 64 bits");
    chorus_key_t k64;
    memset(&k64, 0, sizeof(k64));
    memcpy(k64.b, k5.b, 8);
    h64 = hs;
    tcp_handshake_sign(&h64, &k64, &c);
    EXPECT_REFUSED(tcp_handshake_problem(&h64, &k5, c.nonce, 6, 3, 2),
                   "a handshake keyed by the key's first 64 bits, zero-extended");
    tcp_handshake_t h2 = hs;
    h2.rank = 2; /* changed after signing: the proof no longer matches */
    EXPECT_REFUSED(tcp_handshake_problem(&h2, &k5, c.nonce, 6, 2, 2), "a claim changed in flight");
    h2 = hs;
    h2.index = 2;
    tcp_handshake_sign(&h2, &k5, &c);
    EXPECT_REFUSED(tcp_handshake_problem(&h2, &k5, c.nonce, 6, 3, 2), "socket index 2 of 2");
    h2 = hs;
    h2.conn_id = 7;
    tcp_handshake_sign(&h2, &k5, &c);
    EXPECT_REFUSED(tcp_handshake_problem(&h2, &k5, c.nonce, 6, 3, 2), "another connection id");
    /* The receiver's acknowledgement proves it knows the secret too, for this handshake only. */
    tcp_ack_t ack;
    tcp_ack_make(&hs, &k5, c.nonce, &ack);
    if (!tcp_ack_ok(&ack, &hs, &k5, c.nonce) || tcp_ack_ok(&ack, &hs, &k4, c.nonce) ||
        tcp_ack_ok(&ack, &hs, &k5, other.nonce) || tcp_ack_ok(&ack, &h2, &k5, c.nonce)) {
        snprintf(fail, len, "the acknowledgement's proof");
        return -1;
    }
    /* No 4-byte run of the secret appears in what the sender writes. */
    for (size_t k = 0; k + 4 <= sizeof(k5.b); k++) {
        for (size_t off = 0; off + 4 <= sizeof(hs); off++) {
            if (memcmp((const char *)&hs + off, k5.b + k, 4) == 0) {
                snprintf(fail, len, "key bytes %zu..%zu appear in the handshake at byte %zu", k,
                         k + 3, off);
                return -1;
            }
        }
    }
    return 0;
}
