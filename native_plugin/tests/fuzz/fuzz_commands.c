/* libFuzzer target: the plugin's command intake. The input is read as a list of
 * frames the agent could send, each well framed (right magic, a known type, its
 * exact payload size), so the fuzzer spends its time on what the frames say:
 * command kinds, COMMAND and extension pairing, weights, transit counts. Each
 * record is one selector byte then the payload bytes (zero-filled when the input
 * runs out):
 *   selector & 7        type: COMMAND, WEIGHTS, TRANSIT, ACK, PROGRESS, HELLO
 *   selector & 8        header version 2 instead of 1
 *   selector & 16       an extension names the last COMMAND's id (as the agent does)
 *   selector & 32       a COMMAND's kind is taken mod 9 (known kinds, mostly)
 * The stream is then fed 1 to 64 bytes at a time (the first byte's top bits). */
#include "fuzz_plugin.h"

#define MAX_STREAM 8192

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const uint16_t types[8] = {
      RAILOVER_MSG_COMMAND, RAILOVER_MSG_COMMAND_WEIGHTS, RAILOVER_MSG_COMMAND_TRANSIT,
      RAILOVER_MSG_ACK,     RAILOVER_MSG_PROGRESS,        RAILOVER_MSG_HELLO,
      RAILOVER_MSG_COMMAND, RAILOVER_MSG_COMMAND_WEIGHTS};
  static uint8_t stream[MAX_STREAM];
  size_t len = 0, off = 1;
  uint64_t last_id = 0;
  while (off < size) {
    uint8_t sel = data[off++];
    uint16_t type = types[sel & 7];
    uint16_t version = (sel & 8) ? 2 : 1;
    uint32_t plen = expected_payload(type, version);
    if (len + RAILOVER_WIRE_HEADER_SIZE + plen > MAX_STREAM) break;
    railover_wire_header h = {RAILOVER_WIRE_MAGIC, version, type, plen, 0};
    memcpy(stream + len, &h, sizeof(h));
    uint8_t* payload = stream + len + RAILOVER_WIRE_HEADER_SIZE;
    size_t take = size - off < plen ? size - off : plen;
    memset(payload, 0, plen);
    memcpy(payload, data + off, take);
    off += take;
    if (type == RAILOVER_MSG_COMMAND) {
      railover_wire_command c;
      memcpy(&c, payload, sizeof(c));
      if (sel & 32) c.kind %= 9;
      last_id = c.command_id;
      memcpy(payload, &c, sizeof(c));
    } else if ((type == RAILOVER_MSG_COMMAND_WEIGHTS || type == RAILOVER_MSG_COMMAND_TRANSIT) &&
               (sel & 16)) {
      memcpy(payload, &last_id, sizeof(last_id)); /* command_id leads both */
    }
    len += RAILOVER_WIRE_HEADER_SIZE + plen;
  }
  rv_plugin* p = fuzz_plugin();
  fuzz_feed(p, stream, len, (size_t)(data[0] & 0x3f) + 1, data[0] >> 7);
  return 0;
}
