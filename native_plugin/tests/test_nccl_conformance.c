/*
 * The project's NCCL profiler header against NCCL's layouts (tests/nccl_facts.h),
 * field by field: compiled as C11 and as C++17 (make builds both), every check a
 * static assertion, so a drift fails the build; the program then prints the
 * table it checked.
 *
 * Three layers, each against the one below it:
 *   1. tests/nccl_facts.h's structs give NCCL's LP64 numbers (its NF_* table);
 *   2. include/railover_nccl_abi.h's structs put every field they declare where
 *      NCCL's are, with the same size, and are no larger than NCCL's descriptor
 *      (the plugin reads NCCL's memory, never past it);
 *   3. the event bits and result codes the plugin uses are NCCL's values.
 */
#include <stdio.h>

#include "nccl_facts.h"
#include "railover_nccl_abi.h"

#define SAME(a, b, what) RAILOVER_STATIC_ASSERT((a) == (b), what)
#define FIELD_SIZE(type, field) sizeof(((type*)0)->field)

#if defined(__x86_64__) || defined(__aarch64__)
/* 1. The mirror is NCCL's layout. */
SAME(sizeof(nf_descr_v4), NF_V4_SIZE, "v4 descriptor size");
SAME(sizeof(nf_descr_v5), NF_V5_SIZE, "v5 descriptor size");
SAME(sizeof(nf_descr_v6), NF_V6_SIZE, "v6 descriptor size");
#define MIRROR_COMMON(T, v)                                                         \
  SAME(offsetof(T, type), NF_OFF_TYPE, v " type");                                  \
  SAME(offsetof(T, parentObj), NF_OFF_PARENT, v " parentObj");                      \
  SAME(offsetof(T, rank), NF_OFF_RANK, v " rank");                                  \
  SAME(offsetof(T, u), NF_OFF_UNION, v " union");                                   \
  SAME(offsetof(T, u.coll.seqNumber), NF_OFF_SEQ, v " coll.seqNumber");             \
  SAME(offsetof(T, u.coll.func), NF_OFF_FUNC, v " coll.func");                      \
  SAME(offsetof(T, u.coll.sendBuff), NF_OFF_SEND, v " coll.sendBuff");              \
  SAME(offsetof(T, u.coll.recvBuff), NF_OFF_RECV, v " coll.recvBuff");              \
  SAME(offsetof(T, u.coll.count), NF_OFF_COUNT, v " coll.count");                   \
  SAME(offsetof(T, u.coll.root), NF_OFF_ROOT, v " coll.root");                      \
  SAME(offsetof(T, u.coll.datatype), NF_OFF_DATATYPE, v " coll.datatype");          \
  SAME(offsetof(T, u.coll.nChannels), NF_OFF_NCHANNELS, v " coll.nChannels");       \
  SAME(offsetof(T, u.coll.nWarps), NF_OFF_NWARPS, v " coll.nWarps");                \
  SAME(offsetof(T, u.coll.algo), NF_OFF_ALGO, v " coll.algo");                      \
  SAME(offsetof(T, u.coll.proto), NF_OFF_PROTO, v " coll.proto");                   \
  SAME(offsetof(T, u.kernelCh.channelId), NF_OFF_KCH_CHANNEL, v " kernelCh.channelId"); \
  SAME(offsetof(T, u.kernelCh.pTimer), NF_OFF_KCH_PTIMER, v " kernelCh.pTimer")
MIRROR_COMMON(nf_descr_v4, "v4");
MIRROR_COMMON(nf_descr_v5, "v5");
MIRROR_COMMON(nf_descr_v6, "v6");
SAME(offsetof(nf_descr_v5, u.coll.parentGroup), NF_OFF_PARENT_GROUP, "v5 coll.parentGroup");
SAME(offsetof(nf_descr_v6, u.coll.parentGroup), NF_OFF_PARENT_GROUP, "v6 coll.parentGroup");
SAME(FIELD_SIZE(nf_descr_v4, type), 1, "v4 type is a uint8_t");
SAME(FIELD_SIZE(nf_descr_v5, type), 8, "v5 type is a uint64_t");
SAME(FIELD_SIZE(nf_descr_v6, type), 8, "v6 type is a uint64_t");
#define MIRROR_TABLE(T)                                                  \
  SAME(sizeof(T), NF_TABLE_SIZE, #T " size");                           \
  SAME(offsetof(T, init), NF_TABLE_INIT, #T " init");                   \
  SAME(offsetof(T, startEvent), NF_TABLE_START, #T " startEvent");      \
  SAME(offsetof(T, stopEvent), NF_TABLE_STOP, #T " stopEvent");         \
  SAME(offsetof(T, recordEventState), NF_TABLE_RECORD, #T " recordEventState"); \
  SAME(offsetof(T, finalize), NF_TABLE_FINALIZE, #T " finalize")
MIRROR_TABLE(nf_profiler_v4);
MIRROR_TABLE(nf_profiler_v5);
MIRROR_TABLE(nf_profiler_v6);
#endif

/* 2. The project's header, field by field, against the mirror (any ABI). */
#define PROJECT_DESCR(R, N, v)                                                          \
  SAME(offsetof(R, type), offsetof(N, type), v " type");                               \
  SAME(FIELD_SIZE(R, type), FIELD_SIZE(N, type), v " type size");                      \
  SAME(offsetof(R, parent_obj), offsetof(N, parentObj), v " parentObj");               \
  SAME(offsetof(R, rank), offsetof(N, rank), v " rank");                               \
  SAME(offsetof(R, u.coll.seq_number), offsetof(N, u.coll.seqNumber), v " seqNumber"); \
  SAME(FIELD_SIZE(R, u.coll.seq_number), FIELD_SIZE(N, u.coll.seqNumber), v " seqNumber size"); \
  SAME(offsetof(R, u.coll.func), offsetof(N, u.coll.func), v " func");                 \
  SAME(offsetof(R, u.coll.send_buff), offsetof(N, u.coll.sendBuff), v " sendBuff");    \
  SAME(offsetof(R, u.coll.recv_buff), offsetof(N, u.coll.recvBuff), v " recvBuff");    \
  SAME(offsetof(R, u.coll.count), offsetof(N, u.coll.count), v " count");              \
  SAME(offsetof(R, u.coll.root), offsetof(N, u.coll.root), v " root");                 \
  SAME(offsetof(R, u.coll.datatype), offsetof(N, u.coll.datatype), v " datatype");     \
  SAME(offsetof(R, u.coll.n_channels), offsetof(N, u.coll.nChannels), v " nChannels"); \
  SAME(FIELD_SIZE(R, u.coll.n_channels), FIELD_SIZE(N, u.coll.nChannels), v " nChannels size"); \
  RAILOVER_STATIC_ASSERT(sizeof(R) <= sizeof(N), v " read no further than NCCL's descriptor")
PROJECT_DESCR(rvn_descr_v4, nf_descr_v4, "v4");
PROJECT_DESCR(rvn_descr_v5, nf_descr_v5, "v5");
PROJECT_DESCR(rvn_descr_v5, nf_descr_v6, "v6");

#define PROJECT_TABLE(R, N)                                                        \
  SAME(sizeof(R), sizeof(N), #R " size");                                          \
  SAME(offsetof(R, name), offsetof(N, name), #R " name");                          \
  SAME(offsetof(R, init), offsetof(N, init), #R " init");                          \
  SAME(offsetof(R, start_event), offsetof(N, startEvent), #R " startEvent");       \
  SAME(offsetof(R, stop_event), offsetof(N, stopEvent), #R " stopEvent");          \
  SAME(offsetof(R, record_event_state), offsetof(N, recordEventState), #R " recordEventState"); \
  SAME(offsetof(R, finalize), offsetof(N, finalize), #R " finalize")
PROJECT_TABLE(rvn_profiler_v4, nf_profiler_v4);
PROJECT_TABLE(rvn_profiler_v5, nf_profiler_v5);
PROJECT_TABLE(rvn_profiler_v6, nf_profiler_v6);

/* 3. Values. */
SAME(RVN_PROFILE_COLL, NF_COLL, "ncclProfileColl");
SAME(RVN_PROFILE_KERNEL_CH, NF_KERNEL_CH, "ncclProfileKernelCh");
SAME(RVN_SUCCESS, 0, "ncclSuccess");
SAME(sizeof(rvn_result), sizeof(int), "ncclResult_t is int-sized");

typedef struct {
  const char* version;
  const char* field;
  size_t nccl, project;
} row;

int main(void) {
  static const row rows[] = {
      {"v4", "descriptor size", sizeof(nf_descr_v4), sizeof(rvn_descr_v4)},
      {"v4", "coll.seqNumber", offsetof(nf_descr_v4, u.coll.seqNumber),
       offsetof(rvn_descr_v4, u.coll.seq_number)},
      {"v4", "coll.func", offsetof(nf_descr_v4, u.coll.func), offsetof(rvn_descr_v4, u.coll.func)},
      {"v4", "coll.nChannels", offsetof(nf_descr_v4, u.coll.nChannels),
       offsetof(rvn_descr_v4, u.coll.n_channels)},
      {"v5", "descriptor size", sizeof(nf_descr_v5), sizeof(rvn_descr_v5)},
      {"v5", "coll.seqNumber", offsetof(nf_descr_v5, u.coll.seqNumber),
       offsetof(rvn_descr_v5, u.coll.seq_number)},
      {"v5", "coll.nChannels", offsetof(nf_descr_v5, u.coll.nChannels),
       offsetof(rvn_descr_v5, u.coll.n_channels)},
      {"v6", "descriptor size", sizeof(nf_descr_v6), sizeof(rvn_descr_v5)},
      {"v6", "coll.nChannels", offsetof(nf_descr_v6, u.coll.nChannels),
       offsetof(rvn_descr_v5, u.coll.n_channels)},
      {"v4-v6", "function table size", sizeof(nf_profiler_v6), sizeof(rvn_profiler_v6)},
  };
#ifdef __cplusplus
  const char* lang = "C++17";
#else
  const char* lang = "C11";
#endif
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
    printf("  %-6s %-20s NCCL %3zu  railover %3zu\n", rows[i].version, rows[i].field,
           rows[i].nccl, rows[i].project);
  printf("nccl conformance (%s): layouts of v4, v5 and v6 match\n", lang);
  return 0;
}
