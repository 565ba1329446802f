/* tests/vm: run a command in a new cgroup and mount namespace with a cgroup2 filesystem
 * mounted afresh, as a container runtime gives a container its own cgroup tree (the
 * container's cgroup is the root it sees); read-only with CGNS_READONLY set, as the CRI plugin
 * mounts it. Built statically with the guest's compiler; busybox's unshare has no cgroup
 * namespace. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cgns COMMAND [ARG...]\n");
        return 2;
    }
    if (unshare(CLONE_NEWCGROUP | CLONE_NEWNS) != 0) {
        perror("cgns: unshare");
        return 1;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        umount2("/sys/fs/cgroup", MNT_DETACH) != 0 ||
        mount("cgroup2", "/sys/fs/cgroup", "cgroup2",
              getenv("CGNS_READONLY") ? MS_RDONLY : 0, NULL) != 0) {
        perror("cgns: remounting /sys/fs/cgroup");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror("cgns: exec");
    return 127;
}
