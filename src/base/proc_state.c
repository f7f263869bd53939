/*
 * proc_state.c: what the kernel says a process of this host is doing (/proc/<pid>/stat), for
 * error texts: a peer that makes no progress while it is alive is often stopped (SIGSTOP, job
 * control, a debugger), which no liveness probe sees.
 */
#include "proc_state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int chorus_proc_state(int pid) {
    if (pid <= 0) return CHORUS_PROC_UNKNOWN;
    char path[32], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? CHORUS_PROC_GONE : CHORUS_PROC_UNKNOWN;
    const ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return CHORUS_PROC_UNKNOWN;
    buf[n] = 0;
    /* "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last
     * ')'. */
    const char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return CHORUS_PROC_UNKNOWN;
    switch (p[2]) {
    case 'T': /* stopped by a signal */
    case 't': /* stopped by a tracer */
        return CHORUS_PROC_STOPPED;
    case 'Z': /* exited, not yet reaped */
    case 'X':
        return CHORUS_PROC_GONE;
    default:
        return CHORUS_PROC_RUNNING;
    }
}
