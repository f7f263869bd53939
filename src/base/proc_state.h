/*
 * proc_state.h: the state of a process of this host, as /proc tells it (proc_state.c).
 */
#ifndef CHORUS_BASE_PROC_STATE_H_
#define CHORUS_BASE_PROC_STATE_H_

#ifdef __cplusplus
extern "C" {
#endif

enum {
    CHORUS_PROC_UNKNOWN = 0, /* no /proc, another pid namespace, not readable */
    CHORUS_PROC_RUNNING,     /* running or sleeping: alive and able to move */
    CHORUS_PROC_STOPPED,     /* stopped by a signal or a tracer: alive, moves nothing */
    CHORUS_PROC_GONE,        /* exited (a zombie, or no such process) */
};

/* The state of process pid of this pid namespace. */
int chorus_proc_state(int pid);

#ifdef __cplusplus
}
#endif

#endif
