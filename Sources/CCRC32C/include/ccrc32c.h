#ifndef FERRY_CCRC32C_H
#define FERRY_CCRC32C_H

#include <stddef.h>
#include <stdint.h>

/// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78).
///
/// `crc` is the value returned by a previous call (0 to start); the pre- and
/// post-inversion are done inside, so `ferry_crc32c(ferry_crc32c(0, a), b)`
/// equals the CRC of `a` followed by `b`. Uses the CPU's CRC32C instruction
/// (SSE4.2 on x86-64, the CRC extension on ARM64) when the running CPU has it.
uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t length);

/// The table-driven implementation, always available (for tests and as the fallback).
uint32_t ferry_crc32c_portable(uint32_t crc, const void *data, size_t length);

/// 1 when `ferry_crc32c` uses the CPU instruction on this machine, 0 otherwise.
int ferry_crc32c_hardware_available(void);

#endif
