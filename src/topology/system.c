/*
 * system.c: load the hwloc topology the rest of the pipeline reads.
 *
 * The machine itself by default; CHORUS_TOPO_FILE (or NCCL_TOPO_FILE, accepted only when it is an
 * hwloc XML, since NCCL's own topology XML is a different format) names an XML file to load instead;
 * "synthetic:<description>" builds hwloc's synthetic topology (tests). PCI devices, GPUs and NICs are
 * kept so that the PCI switch above a GPU or NIC can be found.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "topo_internal.h"

static int file_is_hwloc_xml(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, "<topology") != NULL && strstr(buf, "<system") == NULL;
}

/* hwloc's XML import crashes on some malformed files (hwloc 2.9: an object without its
 * complete_nodeset dereferences NULL). A topology file is therefore first loaded in a child
 * process; only a file that loads there is loaded here. 1 when the child loaded it, 0 when it
 * failed or died (or did not finish within 10 s), -1 when no child could be started. */
static int xml_loads_in_child(const char *path) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* A crash here only answers "no": the application's (or a sanitizer's) crash handlers
         * must not report it as theirs. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
        for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
            sigaction(fatal[i], &dfl, NULL);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2); /* hwloc's and a crash's messages: the parent WARNs */
        hwloc_topology_t t;
        if (hwloc_topology_init(&t) != 0) _exit(2);
        hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        if (hwloc_topology_set_xml(t, path) != 0 || hwloc_topology_load(t) != 0) _exit(1);
        _exit(0);
    }
    int status = 0;
    for (int waited_ms = 0;; waited_ms++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if ((r < 0 && errno != EINTR) || waited_ms >= 10000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 0;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

const char *topo_system_source(void) {
    const char *file = chorus_param_str(PARAM_TOPO_FILE);
    if (file && chorus_param_source(PARAM_TOPO_FILE) == PARAM_SRC_ENV_NCCL && !file_is_hwloc_xml(file))
        file = NULL;
    return file ? file : "machine";
}

ncclResult_t topo_system_load(const char *spec, hwloc_topology_t *topo_p) {
    hwloc_topology_t topo;
    if (spec == NULL) {
        spec = chorus_param_str(PARAM_TOPO_FILE);
        /* NCCL_TOPO_FILE usually names NCCL's own XML format, which hwloc cannot read: a program
         * written for NCCL must still start, so that file is ignored (CHORUS_TOPO_FILE is strict). */
        if (spec && chorus_param_source(PARAM_TOPO_FILE) == PARAM_SRC_ENV_NCCL &&
            !file_is_hwloc_xml(spec)) {
            INFO(SUB_GRAPH | SUB_INIT, "NCCL_TOPO_FILE=%s is not an hwloc XML file; discovering the "
                 "machine instead", spec);
            spec = NULL;
        }
    }
    if (hwloc_topology_init(&topo) != 0) {
        WARN("hwloc_topology_init failed: %s", strerror(errno));
        return ncclSystemError;
    }
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (spec && strncmp(spec, "synthetic:", 10) == 0) {
        if (hwloc_topology_set_synthetic(topo, spec + 10) != 0) {
            WARN("topology: invalid synthetic description '%s'", spec + 10);
            hwloc_topology_destroy(topo);
            return ncclInvalidArgument;
        }
    } else if (spec) {
        if (!file_is_hwloc_xml(spec)) {
            WARN("topology: %s is not an hwloc XML file (CHORUS_TOPO_FILE / NCCL_TOPO_FILE)", spec);
            hwloc_topology_destroy(topo);
            return ncclInvalidArgument;
        }
        if (xml_loads_in_child(spec) == 0) {
            WARN("topology: %s is not a valid hwloc XML topology (hwloc could not load it)", spec);
            hwloc_topology_destroy(topo);
            return ncclInvalidArgument;
        }
        if (hwloc_topology_set_xml(topo, spec) != 0) {
            WARN("topology: cannot load hwloc XML %s: %s", spec, strerror(errno));
            hwloc_topology_destroy(topo);
            return ncclInvalidArgument;
        }
    }
    if (hwloc_topology_load(topo) != 0) {
        WARN("topology: hwloc_topology_load failed: %s", strerror(errno));
        hwloc_topology_destroy(topo);
        return ncclSystemError;
    }
    *topo_p = topo;
    return ncclSuccess;
}
