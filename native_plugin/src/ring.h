/*
 * Bounded lock-free queue of fixed-size elements (internal, not exported).
 *
 * Vyukov's bounded MPMC design: every slot carries a sequence number that
 * tells producers and consumers whose turn the slot is, so a producer claims
 * a position with one CAS on `tail` and publishes it with one release store;
 * no producer ever waits for another. A producer that has claimed but not yet
 * published a slot only delays consumers, never other producers, which is
 * the side that must not stall (the CCL's proxy threads).
 *
 * Reserve/commit and peek/release pairs let callers build and read elements
 * in place instead of copying through a temporary.
 */
#ifndef RAILOVER_RING_H
#define RAILOVER_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define RV_CACHE_LINE 64

typedef struct rv_ring {
  unsigned char* slots; /* capacity * stride bytes, RV_CACHE_LINE aligned */
  size_t stride;        /* bytes per slot: sequence number + element, padded */
  uint64_t mask;        /* capacity - 1; capacity is a power of two */
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t tail; /* next position to produce */
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t head; /* next position to consume */
  _Alignas(RV_CACHE_LINE) char pad_;
} rv_ring;

/* Byte offset of the element inside a slot; keeps it 8-byte aligned. */
#define RV_RING_DATA_OFFSET 8u

/* capacity must be a power of two. Returns 0, or -1 when allocation fails. */
int rv_ring_init(rv_ring* r, uint64_t capacity, size_t elem_size);
void rv_ring_destroy(rv_ring* r);

/* Claims the next slot; returns the element to fill and its position, or
 * NULL when the ring is full. Must be followed by rv_ring_commit. */
void* rv_ring_reserve(rv_ring* r, uint64_t* pos);
void rv_ring_commit(rv_ring* r, uint64_t pos);

/* Takes the oldest published element, or NULL when none is ready. Must be
 * followed by rv_ring_release once the element has been read. */
void* rv_ring_peek(rv_ring* r, uint64_t* pos);
void rv_ring_release(rv_ring* r, uint64_t pos);

/* Elements claimed and not yet released; exact only when nobody is active. */
uint64_t rv_ring_count(const rv_ring* r);

#endif /* RAILOVER_RING_H */
