/*
 * errors.c: the text of each result code (errors.h).
 */
#include "errors.h"

const char *chorus_result_text(ncclResult_t result) {
    switch (result) {
    case ncclSuccess:
        return "success";
    case ncclUnhandledCudaError:
        return "a CUDA call failed (NCCL_DEBUG=WARN shows which)";
    case ncclSystemError:
        return "a system call or network operation failed, or a deadline passed "
               "(NCCL_DEBUG=WARN shows which)";
    case ncclInternalError:
        return "internal error in Chorus (please report it)";
    case ncclInvalidArgument:
        return "invalid argument (NCCL_DEBUG=WARN names it)";
    case ncclInvalidUsage:
        return "invalid usage of the API (NCCL_DEBUG=WARN says why)";
    case ncclRemoteError:
        return "a peer rank failed, exited or aborted, or the network broke";
    case ncclInProgress:
        return "operation in progress";
    default:
        return "unknown result code";
    }
}
