#define _GNU_SOURCE
#include "cfilespace.h"

#include <errno.h>
#include <fcntl.h>

int ferry_fallocate(int fd, int64_t length) {
#if defined(__linux__)
    return fallocate(fd, 0, 0, (off_t)length);
#else
    (void)fd;
    (void)length;
    errno = ENOTSUP;
    return -1;
#endif
}
