/*
 * What the fuzz targets share: librailover_plugin.so's own code (src/plugin.c is
 * compiled in, so its static wire decoder and command intake are reachable without
 * a socket or a sender thread), one plugin state reused across inputs, and the
 * checks every input must pass.
 *
 * Built two ways (native_plugin/Makefile): with gcc and replay.c, which runs the
 * committed corpus under ASan+UBSan in `make test`; with clang's libFuzzer
 * (-fsanitize=fuzzer), for longer runs (benchmarks/fuzz_plugin.sh).
 */
#ifndef RAILOVER_FUZZ_PLUGIN_H
#define RAILOVER_FUZZ_PLUGIN_H

#include "../../src/plugin.c"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "fuzz check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                               \
    }                                                                        \
  } while (0)

/* One plugin, as init_with leaves it, minus the thread and the socket (fd -1:
 * a malformed frame "disconnects" it, which is what the decoder does then). */
static rv_plugin* fuzz_plugin(void) {
  static rv_plugin* p;
  if (p == NULL) {
    FUZZ_CHECK(posix_memalign((void**)&p, RV_CACHE_LINE, sizeof(*p)) == 0);
    memset(p, 0, sizeof(*p));
    FUZZ_CHECK(rv_ring_init(&p->reports, MIN_RING, sizeof(rv_report_slot)) == 0);
    FUZZ_CHECK(rv_ring_init(&p->acks, QUEUE_SMALL, sizeof(rv_ack_slot)) == 0);
    FUZZ_CHECK(rv_ring_init(&p->commands, QUEUE_SMALL, sizeof(railover_command_v2_t)) == 0);
    p->wake_fds[0] = p->wake_fds[1] = -1;
  }
  p->fd = -1;
  p->in_len = 0;
  p->ext_waiting = 0;
  atomic_store(&p->connected, 1);
  return p;
}

static int finite_weight(float w) { return isfinite(w) && w >= 0.0f; }

/* Hands out every queued command through the v2 or the v1 view and checks it is
 * one the library may give a CCL; then empties the answers it queued. */
static void fuzz_drain(rv_plugin* p, int v1_view) {
  for (;;) {
    railover_command_v2_t c;
    int rc;
    if (v1_view) {
      memset(&c, 0, sizeof(c));
      rc = poll_command(p, &c.base);
      if (rc == RAILOVER_OK)
        FUZZ_CHECK(c.base.kind != RAILOVER_CMD_BALANCE && c.base.kind != RAILOVER_CMD_NVL_TRANSIT);
    } else {
      rc = poll_command_v2(p, &c, sizeof(c));
    }
    if (rc == RAILOVER_NO_COMMAND) break;
    FUZZ_CHECK(rc == RAILOVER_OK);
    FUZZ_CHECK(known_kind(c.base.kind));
    if (!v1_view && c.base.kind == RAILOVER_CMD_BALANCE) {
      FUZZ_CHECK(c.n_channels >= 1 && c.n_channels <= RAILOVER_WIRE_MAX_CHANNELS);
      FUZZ_CHECK(isfinite(c.split_ratio) && c.split_ratio >= 0.0f && c.split_ratio < 1.0f);
      double sum = 0.0;
      for (uint32_t i = 0; i < c.n_channels; i++) {
        FUZZ_CHECK(finite_weight(c.weights[i]));
        sum += c.weights[i];
      }
      FUZZ_CHECK(sum > 0.0);
    } else if (!v1_view && c.base.kind == RAILOVER_CMD_NVL_TRANSIT) {
      FUZZ_CHECK(c.n_transit >= 1 && c.n_transit <= RAILOVER_WIRE_MAX_TRANSIT);
      FUZZ_CHECK(c.mb_per_channel >= 1);
    } else if (!v1_view) {
      FUZZ_CHECK(c.n_channels == 0 && c.n_transit == 0);
    }
  }
  uint64_t pos;
  rv_ack_slot* a;
  while ((a = rv_ring_peek(&p->acks, &pos)) != NULL) {
    FUZZ_CHECK(a->status == RAILOVER_ACK_FAILED || a->status == RAILOVER_ACK_UNSUPPORTED ||
               a->status == RAILOVER_ACK_BUSY);
    rv_ring_release(&p->acks, pos);
  }
}

/* Feeds `stream` to the decoder `chunk` bytes at a time, as recv() might deliver
 * it. After each call the buffer holds less than one whole frame (so a read
 * always has room), and a malformed frame empties it. */
static void fuzz_feed(rv_plugin* p, const uint8_t* stream, size_t size, size_t chunk, int v1_view) {
  size_t off = 0;
  while (off < size) {
    size_t n = size - off < chunk ? size - off : chunk;
    if (n > IN_BUF_SIZE - p->in_len) n = IN_BUF_SIZE - p->in_len;
    FUZZ_CHECK(n > 0);
    memcpy(p->in_buf + p->in_len, stream + off, n);
    p->in_len += (uint32_t)n;
    off += n;
    if (parse_input(p) < 0) {
      FUZZ_CHECK(p->in_len == 0 && !p->ext_waiting);
      p->fd = -1;
      atomic_store(&p->connected, 1);
    }
    FUZZ_CHECK(p->in_len < RAILOVER_WIRE_HEADER_SIZE + RAILOVER_WIRE_MAX_PAYLOAD);
    fuzz_drain(p, v1_view);
  }
}

#endif /* RAILOVER_FUZZ_PLUGIN_H */
