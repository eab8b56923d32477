// libFuzzer's driver, which the fuzzer runtime (-sanitize=fuzzer) links in. SwiftPM renames an
// executable's entry point to `<module>_main` and points `main` at it, so libFuzzer's own main
// is never used: each target's `<module>_main` calls this instead.
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
