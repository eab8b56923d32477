// Declarations only (see include/CFuzzerDriver.h); the definitions come with the toolchain's libFuzzer.
#include "CFuzzerDriver.h"
