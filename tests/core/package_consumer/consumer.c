/* consumer.c: built against an installed Chorus; makes and destroys a 2-rank communicator in one
 * process (ncclCommInitAll) and checks the version. Exit status 0 on success. */
#include <nccl.h>
#include <chorus.h>
#include <stdio.h>

int main(void) {
    int v = 0, n = 0;
    ncclComm_t comms[2];
    if (ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE) return 1;
    if (ncclCommInitAll(comms, 2, NULL) != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    if (ncclCommCount(comms[1], &n) != ncclSuccess || n != 2) return 1;
    for (int i = 0; i < 2; i++)
        if (ncclCommDestroy(comms[i]) != ncclSuccess) return 1;
    printf("consumer: Chorus %d.%d, NCCL API %d, 2 ranks OK\n", CHORUS_VERSION_MAJOR,
           CHORUS_VERSION_MINOR, v);
    return 0;
}
