#ifndef FERRY_CFILESPACE_H
#define FERRY_CFILESPACE_H

#include <stdint.h>

/// `fallocate(fd, 0, 0, length)`: gives the file blocks up to `length`, growing it with zeros
/// (Linux; glibc declares it only under _GNU_SOURCE, which Swift's Glibc module does not set).
/// Returns 0, or -1 with `errno` set — `ENOTSUP` on systems without the call. Never falls back
/// to writing zeros (as `posix_fallocate` may).
int ferry_fallocate(int fd, int64_t length);

#endif
