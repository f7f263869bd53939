// The checks a transport makes on its peer's setup blobs and handshakes (setup_blob_cases.c):
// valid ones pass, and each kind of damage is refused before anything is opened, mapped or
// indexed with it.
#include <gtest/gtest.h>

#include "setup_blob_cases.h"

TEST(SetupBlobs, ShmBlobsAndControlHeader) {
    char fail[256] = "";
    EXPECT_EQ(shm_blob_cases(fail, sizeof(fail)), 0) << fail;
}

TEST(SetupBlobs, TcpBlobsAndHandshake) {
    char fail[256] = "";
    EXPECT_EQ(tcp_blob_cases(fail, sizeof(fail)), 0) << fail;
}
