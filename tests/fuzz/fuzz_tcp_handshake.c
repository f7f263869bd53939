/*
 * fuzz_tcp_handshake: what the TCP transport reads from its peer during connection setup: the
 * setup blob that crossed the bootstrap (tcp_blob_problem) and the handshake read from each
 * accepted socket (tcp_handshake_problem). Checks: an accepted blob has the expected magic, side
 * and rank, and a usable address (receiver's blob) or a socket count in 1..TCP_MAX_SOCKS and
 * chunks that fit our slots (sender's blob); an accepted handshake indexes a socket slot that
 * exists (the slot array is allocated at its exact size so AddressSanitizer sees any overrun).
 *
 * Input: [flags][peer][our slot_bytes u64][blob][nsocks][handshake]...
 */
#include "fuzz_common.h"
#include "transport/tcp/tcp.h"

#define FUZZ_SECRET 0x5345435245543031ull
#define FUZZ_CONN_ID 0x434f4e4e49443031ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    int is_send = fuzz_u8(&in) & 1;
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
    int nready = 0;
    while (in.left > 0) {
        tcp_handshake_t hs;
        fuzz_take(&in, &hs, sizeof(hs));
        const char *problem = tcp_handshake_problem(&hs, FUZZ_SECRET, FUZZ_CONN_ID, peer, nsocks);
        if (problem == NULL && sock_fd[hs.index] >= 0) problem = "duplicate socket index";
        if (problem != NULL) continue;
        FUZZ_ASSERT(hs.magic == TCP_HANDSHAKE_MAGIC && hs.secret == FUZZ_SECRET &&
                    hs.conn_id == FUZZ_CONN_ID && hs.rank == peer);
        sock_fd[hs.index] = nready++;
    }
    FUZZ_ASSERT(nready <= nsocks);
    free(sock_fd);
    return 0;
}
