#ifndef FERRY_CLZ4_SHIM_H
#define FERRY_CLZ4_SHIM_H
#include <lz4.h>
#endif
