/*
 * perf_resources.c: what this process holds, for CHORUS_PERF_RESOURCES=1 (perf/resources.py).
 *
 * Threads are the entries of /proc/self/task, descriptors those of /proc/self/fd (less the one
 * that reads the folder). Shared memory is read from /proc/self/maps: every mapping of a file
 * under /dev/shm (Chorus unlinks its segments once both ends mapped them, so they show as
 * "(deleted)" and no longer appear in /dev/shm) counts once per file towards shm_mapped, and
 * towards shm_created when the file's name carries this process's pid (a Chorus segment is named
 * /chorus-shm-<creator pid>-...). The line goes to stderr in one write, so lines of several
 * processes do not mix.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf.h"

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

#define RES_MAX_FILES 4096

static void shm_bytes(unsigned long long *mapped_p, unsigned long long *created_p) {
    *mapped_p = *created_p = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL) return;
    /* One file may be mapped in several ranges; count each inode once, at its largest end. */
    static unsigned long inodes[RES_MAX_FILES];
    static unsigned long long sizes[RES_MAX_FILES];
    static int mine[RES_MAX_FILES];
    int nfiles = 0;
    char line[1024], own[32];
    snprintf(own, sizeof(own), "/chorus-shm-%d-", (int)getpid());
    while (fgets(line, sizeof(line), f)) {
        unsigned long long lo, hi, off;
        unsigned long inode;
        char perms[8], dev[16];
        int pos = 0;
        if (sscanf(line, "%llx-%llx %7s %llx %15s %lu %n", &lo, &hi, perms, &off, dev, &inode,
                   &pos) < 6 ||
            pos == 0)
            continue;
        const char *path = line + pos;
        if (strncmp(path, "/dev/shm/", 9) != 0) continue;
        unsigned long long end = off + (hi - lo);
        int k = 0;
        while (k < nfiles && inodes[k] != inode)
            k++;
        if (k == nfiles) {
            if (nfiles == RES_MAX_FILES) continue;
            inodes[k] = inode;
            sizes[k] = 0;
            mine[k] = strstr(path + 8, own) != NULL;
            nfiles++;
        }
        if (end > sizes[k]) sizes[k] = end;
    }
    fclose(f);
    for (int k = 0; k < nfiles; k++) {
        *mapped_p += sizes[k];
        if (mine[k]) *created_p += sizes[k];
    }
}

void perf_resources_report(const char *phase, int rank) {
    const char *env = getenv("CHORUS_PERF_RESOURCES");
    if (env == NULL || strcmp(env, "1") != 0) return;
    unsigned long long mapped, created;
    shm_bytes(&mapped, &created);
    int fds = count_entries("/proc/self/fd");
    char line[256];
    int n = snprintf(line, sizeof(line),
                     "# chorus-resources rank %d pid %d phase %s threads %d fds %d shm_mapped "
                     "%llu shm_created %llu\n",
                     rank, (int)getpid(), phase, count_entries("/proc/self/task"),
                     fds > 0 ? fds - 1 : fds, mapped, created);
    if (n > 0) {
        ssize_t w = write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
        (void)w;
    }
}
