/*
 * The open check of smoosh/compactors/sqlite_guard.py, in C.
 *
 * SQLite's unix VFS opens every file through its "open" system call, which an application may
 * replace (sqlite3_vfs.xSetSystemCall). og_open is the replacement: for a file of a registered
 * database (the database itself, its -journal, -wal or -shm) it opens the name with
 * O_PATH|O_NOFOLLOW, checks the file that descriptor names (a regular file, one link unless its
 * root opts in, its root's device and mount unless its root opts in, and, for the database
 * itself, the inode the caller meant), then opens /proc/self/fd/N of it with SQLite's flags: the
 * very file checked, whatever the name points at by then. A file not there yet is created with
 * O_EXCL. A refusal fails the open with EPERM before SQLite has a descriptor, and is kept for
 * the caller to read (og_take_refusal).
 *
 * It is C, not a Python callback, because SQLite opens a -shm while it holds its unix VFS's
 * global mutex, and apsw closes connections while it holds the GIL: a callback that needs the
 * GIL there deadlocks against any thread closing a connection. This code takes no lock but its
 * own registry mutex, held only to copy an entry.
 *
 * It is built as a Python extension module only so that setuptools compiles it; Python reaches
 * its functions through ctypes.
 */
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef O_PATH
#define O_PATH 0
#endif

/* Refusal codes (sqlite_guard.py turns them into words). */
#define OG_NOT_REGULAR 1
#define OG_HARD_LINKS 2
#define OG_OTHER_MOUNT 3
#define OG_NOT_MEANT 4
#define OG_THROUGH_SYMLINK 5
#define OG_NAME_GONE 6

#define OG_SIDE_MAX 16
#define OG_CREATE_TRIES 4

typedef struct og_entry {
    struct og_entry *next;
    char *path;
    size_t path_len;
    int connections;
    int has_root;           /* the roots name a root for this database */
    dev_t root_dev;
    long long root_mnt;     /* -1: unknown */
    int allow_links;
    int allow_mounts;
    int refusal;            /* the last refusal's code, 0: none */
    long long refusal_detail;
    char refusal_side[OG_SIDE_MAX];
} og_entry;

static pthread_mutex_t og_lock = PTHREAD_MUTEX_INITIALIZER;
static og_entry *og_entries = NULL;

/* The database file the open on this thread means: set around sqlite3_open_v2 only. */
static __thread char *og_meant_path = NULL;
static __thread dev_t og_meant_dev = 0;
static __thread ino_t og_meant_ino = 0;

static const char *const og_sides[] = {"-wal", "-shm", "-journal"};

/* Copy of what a check needs of an entry, taken under the lock. */
typedef struct {
    int has_root;
    dev_t root_dev;
    long long root_mnt;
    int allow_links;
    int allow_mounts;
} og_policy;

static og_entry *og_find_locked(const char *path, size_t len) {
    for (og_entry *e = og_entries; e; e = e->next)
        if (e->path_len == len && memcmp(e->path, path, len) == 0)
            return e;
    return NULL;
}

/* The entry the file `path` belongs to; its side suffix in *side ("" for the database). */
static og_entry *og_lookup_locked(const char *path, const char **side) {
    size_t len = strlen(path);
    og_entry *e = og_find_locked(path, len);
    if (e) {
        *side = "";
        return e;
    }
    for (size_t i = 0; i < sizeof(og_sides) / sizeof(og_sides[0]); i++) {
        size_t slen = strlen(og_sides[i]);
        if (len > slen && memcmp(path + len - slen, og_sides[i], slen) == 0) {
            e = og_find_locked(path, len - slen);
            if (e) {
                *side = og_sides[i];
                return e;
            }
        }
    }
    return NULL;
}

/* stx_mnt_id of fd (Linux 5.8+), or -1. A raw buffer: older headers lack the field. */
static long long og_mount_id(int fd) {
#ifdef SYS_statx
    unsigned char buf[256];
    memset(buf, 0, sizeof(buf));
    if (syscall(SYS_statx, fd, "", 0x1000 /* AT_EMPTY_PATH */, 0x1000 /* STATX_MNT_ID */, buf) != 0)
        return -1;
    uint32_t mask;
    memcpy(&mask, buf, sizeof(mask));
    if (!(mask & 0x1000))
        return -1;
    uint64_t id;
    memcpy(&id, buf + 144, sizeof(id));
    return (long long)id;
#else
    (void)fd;
    return -1;
#endif
}

/* Tests only: told the path of each file the check probes, after the probe's open and before its
   fstat: the decisive moment of a planted link's race, played deterministically by
   tests/compactor/test_open_check.py. NULL (never set) in the daemon. */
static void (*og_probed_hook)(const char *path) = NULL;

void og_set_probed_hook(void (*hook)(const char *path)) { og_probed_hook = hook; }

/* 0 when the file fd (st) may be opened for `side` of a database with `policy`; else a code. */
static int og_check(int fd, const struct stat *st, const char *side, const og_policy *policy,
                    const char *database, long long *detail) {
    if (!S_ISREG(st->st_mode))
        return OG_NOT_REGULAR;
    if (side[0] == '\0' && og_meant_path && strcmp(og_meant_path, database) == 0 &&
        (st->st_dev != og_meant_dev || st->st_ino != og_meant_ino))
        return OG_NOT_MEANT;
    if (st->st_nlink > 1 && !policy->allow_links) {
        *detail = (long long)st->st_nlink;
        return OG_HARD_LINKS;
    }
    if (policy->has_root && !policy->allow_mounts) {
        if (st->st_dev != policy->root_dev)
            return OG_OTHER_MOUNT;
        if (policy->root_mnt >= 0) {
            long long mnt = og_mount_id(fd);
            if (mnt >= 0 && mnt != policy->root_mnt)
                return OG_OTHER_MOUNT;
        }
    }
    return 0;
}

static void og_note_refusal(const char *database, int code, long long detail, const char *side) {
    pthread_mutex_lock(&og_lock);
    og_entry *e = og_find_locked(database, strlen(database));
    if (e) {
        e->refusal = code;
        e->refusal_detail = detail;
        snprintf(e->refusal_side, OG_SIDE_MAX, "%s", side);
    }
    pthread_mutex_unlock(&og_lock);
}

/* Whether a component of `path` (absolute) is a symbolic link now. */
static int og_has_symlink(const char *path) {
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof(buf))
        return 0;
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            struct stat st;
            if (lstat(buf, &st) == 0 && S_ISLNK(st.st_mode))
                return 1;
            buf[i] = saved;
        }
    }
    return 0;
}

/* Whether the descriptor fd names the path `want` (the kernel's own name for it, from /proc):
   1 yes, 0 no, -1 cannot be told (no /proc). */
static int og_names(int fd, const char *want, size_t want_len) {
    char proc[64], got[PATH_MAX];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(proc, got, sizeof(got));
    if (n < 0 || (size_t)n >= sizeof(got))
        return -1;
    return (size_t)n == want_len && memcmp(got, want, want_len) == 0;
}

/* Open a checked file: the same inode as `probe`, with SQLite's flags. -2: refused (see below). */
static int og_reopen(int probe, int dirfd, const char *base, int flags, int mode, const struct stat *checked) {
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", probe);
    int fd = open(proc, flags & ~(O_CREAT | O_EXCL | O_NOFOLLOW), mode);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    /* No /proc: open the name in the checked directory and compare. A mismatch is refused, its
       descriptor kept open: closing it could drop POSIX locks this process holds on that file. */
    fd = openat(dirfd, base, flags | O_NOFOLLOW, mode);
    if (fd < 0)
        return fd;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != checked->st_dev || st.st_ino != checked->st_ino) {
        errno = EPERM;
        return -2;
    }
    return fd;
}

/* Open `base` in the directory dirfd (checked already) as SQLite asked, checking the file first. */
static int og_open_in(int dirfd, const char *path, const char *base, const char *side, int flags, int mode,
                      const og_policy *policy, const char *database, int *code, long long *detail) {
    for (int attempt = 0; attempt < OG_CREATE_TRIES; attempt++) {
        int probe = openat(dirfd, base, (O_PATH ? O_PATH : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
        if (probe < 0) {
            if (errno != ENOENT || !(flags & O_CREAT))
                return -1;
            int fd = openat(dirfd, base, flags | O_EXCL | O_NOFOLLOW, mode);
            if (fd < 0) {
                if (errno == EEXIST)
                    continue; /* a file took the name meanwhile: look at it as it is */
                return -1;
            }
            struct stat st;
            if (fstat(fd, &st) != 0) {
                int saved = errno;
                close(fd);
                errno = saved;
                return -1;
            }
            *code = og_check(fd, &st, side, policy, database, detail);
            if (*code) {
                close(fd); /* created by this call: nobody holds a lock on it yet */
                return -1;
            }
            return fd;
        }
        if (og_probed_hook)
            og_probed_hook(path);
        struct stat st;
        if (fstat(probe, &st) != 0) {
            int saved = errno;
            close(probe);
            errno = saved;
            return -1;
        }
        *code = og_check(probe, &st, side, policy, database, detail);
        if (!*code && og_names(probe, path, strlen(path)) == 0)
            /* Asked after the link count, never before: a hard link planted under this name and
               unlinked between the probe's open and its fstat leaves the outside file with one
               link, and the probe naming it. A name the kernel still gives the probe now was its
               name at the fstat too (a removed name never comes back), so the one link counted
               then was this name, in the checked directory. */
            *code = OG_NAME_GONE;
        if (*code) {
            close(probe); /* O_PATH: closing it drops no lock of this process */
            return -1;
        }
        int fd = og_reopen(probe, dirfd, base, flags, mode, &st);
        int saved = errno;
        close(probe);
        errno = saved;
        if (fd == -2) {
            *code = OG_NOT_MEANT;
            return -1;
        }
        return fd;
    }
    *code = OG_NOT_MEANT;
    return -1;
}

int og_open(const char *path, int flags, int mode) {
    const char *side = "";
    og_policy policy;
    char *database = NULL;

    pthread_mutex_lock(&og_lock);
    og_entry *e = og_lookup_locked(path, &side);
    if (e) {
        policy.has_root = e->has_root;
        policy.root_dev = e->root_dev;
        policy.root_mnt = e->root_mnt;
        policy.allow_links = e->allow_links;
        policy.allow_mounts = e->allow_mounts;
        database = strndup(e->path, e->path_len);
    }
    pthread_mutex_unlock(&og_lock);
    if (!e)
        return open(path, flags, mode);
    if (!database) {
        errno = ENOMEM;
        return -1;
    }

    int result = -1, code = 0, saved = 0, dirfd = -1;
    long long detail = 0;
    char dir[PATH_MAX];
    /* The directory first, by the kernel's own name for it: a directory swapped for a symbolic
       link (to one outside the roots) is refused here, and every open below is relative to the
       directory checked, whatever its name points at by then. */
    const char *slash = strrchr(path, '/');
    if (!slash || slash[1] == '\0') {
        errno = EINVAL;
        goto done;
    }
    size_t dir_len = slash == path ? 1 : (size_t)(slash - path);
    if (dir_len >= sizeof(dir)) {
        errno = ENAMETOOLONG;
        goto done;
    }
    memcpy(dir, path, dir_len);
    dir[dir_len] = '\0';
    dirfd = open(dir, (O_PATH ? O_PATH : O_RDONLY) | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        goto done;
    if (og_names(dirfd, dir, dir_len) == 0) {
        code = og_has_symlink(path) ? OG_THROUGH_SYMLINK : OG_NOT_MEANT;
        close(dirfd);
        goto done;
    }
    result = og_open_in(dirfd, path, slash + 1, side, flags, mode, &policy, database, &code, &detail);
    saved = errno;
    close(dirfd); /* O_PATH: closing it drops no lock */
    errno = saved;

done:
    if (code) {
        og_note_refusal(database, code, detail, side);
        free(database);
        errno = EPERM;
        return -1;
    }
    saved = errno;
    free(database);
    errno = saved;
    return result;
}

/* Register `path` for one more connection, with the roots' policy for it. 0, or -1 (no memory). */
int og_register(const char *path, int has_root, long long root_dev, long long root_mnt,
                int allow_links, int allow_mounts) {
    int rc = 0;
    pthread_mutex_lock(&og_lock);
    size_t len = strlen(path);
    og_entry *e = og_find_locked(path, len);
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (e)
            e->path = strndup(path, len);
        if (!e || !e->path) {
            free(e);
            rc = -1;
            goto out;
        }
        e->path_len = len;
        e->next = og_entries;
        og_entries = e;
    }
    e->connections++;
    e->has_root = has_root;
    e->root_dev = (dev_t)root_dev;
    e->root_mnt = root_mnt;
    e->allow_links = allow_links;
    e->allow_mounts = allow_mounts;
    e->refusal = 0;
out:
    pthread_mutex_unlock(&og_lock);
    return rc;
}

void og_release(const char *path) {
    pthread_mutex_lock(&og_lock);
    size_t len = strlen(path);
    for (og_entry **p = &og_entries; *p; p = &(*p)->next) {
        og_entry *e = *p;
        if (e->path_len == len && memcmp(e->path, path, len) == 0) {
            if (--e->connections <= 0) {
                *p = e->next;
                free(e->path);
                free(e);
            }
            break;
        }
    }
    pthread_mutex_unlock(&og_lock);
}

/* The last refusal of `path`'s files: its code (0: none), detail and side; then forgotten. */
int og_take_refusal(const char *path, long long *detail, char *side, size_t side_len) {
    int code = 0;
    pthread_mutex_lock(&og_lock);
    og_entry *e = og_find_locked(path, strlen(path));
    if (e && e->refusal) {
        code = e->refusal;
        *detail = e->refusal_detail;
        snprintf(side, side_len, "%s", e->refusal_side);
        e->refusal = 0;
    }
    pthread_mutex_unlock(&og_lock);
    return code;
}

/* The database file the next open on this thread means (path NULL: none). 0, or -1 (no memory). */
int og_mean(const char *path, long long dev, long long ino) {
    free(og_meant_path);
    og_meant_path = NULL;
    if (!path)
        return 0;
    og_meant_path = strdup(path);
    og_meant_dev = (dev_t)dev;
    og_meant_ino = (ino_t)ino;
    return og_meant_path ? 0 : -1;
}

static struct PyModuleDef og_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_openguard",
    .m_doc = "The open check of smoosh.compactors.sqlite_guard, reached through ctypes.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__openguard(void) { return PyModule_Create(&og_module); }
