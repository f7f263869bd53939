/*
 * fuzz_tcp_handshake: what the TCP transport reads from its peer during connection setup: the
 * setup blob that crossed the bootstrap (tcp_blob_problem), the handshake read from each
 * accepted socket after its challenge (tcp_handshake_problem: the proof first) and the
 * receiver's acknowledgement as the sender checks it (tcp_ack_ok). With flags bit 1 (2) the
 * harness signs each handshake with the right key and challenge first, so that the checks after
 * authentication are reached (random bytes never carry a right proof). Checks: an accepted blob has the expected magic, side
 * and rank, and a usable address (receiver's blob) or a socket count in 1..TCP_MAX_SOCKS and
 * chunks that fit our slots (sender's blob); an accepted handshake indexes a socket slot that
 * exists (the slot array is allocated at its exact size so AddressSanitizer sees any overrun).
 *
 * Input: [flags][peer][our slot_bytes u64][blob][nsocks][ack][handshake]...
 */
#include "fuzz_common.h"
#include "transport/tcp/tcp.h"

#define FUZZ_CONN_ID 0x434f4e4e49443031ull
static const uint8_t fuzz_nonce[CHORUS_NONCE_BYTES] = "fuzz-tcp-nonce!";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    uint8_t flags = fuzz_u8(&in);
    int is_send = flags & 1, sign = (flags & 2) != 0;
    const chorus_key_t k = fuzz_key();
    const chorus_key_t *key = &k;
    chorus_key_t other = k;
    other.b[CHORUS_KEY_BYTES - 1] ^= 1;
    int peer = fuzz_u8(&in);
    uint64_t slot_bytes;
    fuzz_take(&in, &slot_bytes, sizeof(slot_bytes));
    tcp_blob_t b;
    fuzz_take(&in, &b, sizeof(b));
    char why[160];
    why[0] = '\0';
    if (tcp_blob_problem(&b, is_send, peer, (size_t)slot_bytes, why, sizeof(why)) != 0) {
        FUZZ_ASSERT(why[0] != '\0' && strlen(why) < sizeof(why));
    } else {
        FUZZ_ASSERT(b.magic == TCP_BLOB_MAGIC && (int)b.is_send != is_send && b.rank == peer);
        if (is_send) {
            FUZZ_ASSERT(b.addr.sa.sa_family == AF_INET || b.addr.sa.sa_family == AF_INET6);
            FUZZ_ASSERT(b.slot_bytes >= slot_bytes);
            char str[80];
            tcp_addr_str(&b.addr, str, sizeof(str));
        } else {
            FUZZ_ASSERT(b.nsocks >= 1 && b.nsocks <= TCP_MAX_SOCKS);
            FUZZ_ASSERT(b.slot_bytes <= slot_bytes);
        }
    }

    /* The receiver's accept loop: handshakes for a connection of nsocks sockets. */
    int nsocks = fuzz_u8(&in) % TCP_MAX_SOCKS + 1;
    int *sock_fd = malloc(sizeof(int) * nsocks);
    FUZZ_ASSERT(sock_fd != NULL);
    for (int i = 0; i < nsocks; i++)
        sock_fd[i] = -1;
    tcp_ack_t ack;
    fuzz_take(&in, &ack, sizeof(ack));
    int nready = 0;
    while (in.left > 0) {
        tcp_handshake_t hs;
        fuzz_take(&in, &hs, sizeof(hs));
        if (sign)
            chorus_auth_proof(key->b, sizeof(key->b), TCP_AUTH_LABEL, CHORUS_AUTH_CLIENT, hs.nonce,
                              fuzz_nonce, &hs, TCP_HANDSHAKE_CLAIMS, NULL, 0, hs.proof);
        /* The sender's check of an acknowledgement: the fuzzed one, then the receiver's own. */
        (void)tcp_ack_ok(&ack, &hs, key, fuzz_nonce);
        tcp_ack_t good;
        tcp_ack_make(&hs, key, fuzz_nonce, &good);
        FUZZ_ASSERT(tcp_ack_ok(&good, &hs, key, fuzz_nonce));
        FUZZ_ASSERT(!tcp_ack_ok(&good, &hs, &other, fuzz_nonce));
        const char *problem = tcp_handshake_problem(&hs, key, fuzz_nonce, FUZZ_CONN_ID, peer, nsocks);
        if (problem == NULL && sock_fd[hs.index] >= 0) problem = "duplicate socket index";
        if (problem != NULL) continue;
        FUZZ_ASSERT(hs.magic == TCP_HANDSHAKE_MAGIC && hs.version == TCP_WIRE_VERSION &&
                    hs.conn_id == FUZZ_CONN_ID && hs.rank == peer);
        /* Accepted only with a right proof: never under another key or challenge. */
        FUZZ_ASSERT(tcp_handshake_problem(&hs, &other, fuzz_nonce, FUZZ_CONN_ID, peer, nsocks));
        sock_fd[hs.index] = nready++;
    }
    FUZZ_ASSERT(nready <= nsocks);
    free(sock_fd);
    return 0;
}
