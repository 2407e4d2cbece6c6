/* libFuzzer target: the plugin's wire decoder (parse_input) on arbitrary bytes from
 * the agent's side of the socket. Byte 0 picks how recv() splits the stream (1 to
 * 256 bytes at a time) and whether the CCL polls through the v1 or the v2 view; the
 * rest is the stream. */
#include "fuzz_plugin.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  rv_plugin* p = fuzz_plugin();
  fuzz_feed(p, data + 1, size - 1, (size_t)(data[0] & 0x7f) * 2 + 1, data[0] >> 7);
  return 0;
}
