/* setup_blob_cases.h: see setup_blob_cases.c. 0, or -1 with the failing case in fail. */
#ifndef CHORUS_TEST_SETUP_BLOB_CASES_H_
#define CHORUS_TEST_SETUP_BLOB_CASES_H_
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
int shm_blob_cases(char *fail, size_t len);
int tcp_blob_cases(char *fail, size_t len);
#ifdef __cplusplus
}
#endif
#endif
