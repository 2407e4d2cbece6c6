/*
 * NCCL's profiler plugin interface as NCCL itself lays it out, for the conformance
 * tests: versions 4, 5 and 6, the ones NCCL 2.27.3 to 2.30.x look up.
 *
 * Written here from the facts of NCCL's headers (src/include/plugin/profiler/
 * profiler_v4.h, _v5.h, _v6.h and nccl_profiler.h): member order, types, enum
 * values. Nothing is copied; the names are ours (nf_ for "NCCL fact"). Unlike
 * include/railover_nccl_abi.h, which declares only what the plugin reads, these
 * are whole: the driver allocates descriptors the size NCCL does and calls the
 * plugin through NCCL's own function table shapes.
 *
 * Which release binds which table: NCCL's loader dlsyms the newest
 * ncclProfiler_vN it knows first, then older ones.
 *   2.27.x          ncclProfiler_v4 (newest it knows; v5 arrived in 2.28.3)
 *   2.28.x          ncclProfiler_v5
 *   2.29.x, 2.30.x  ncclProfiler_v6 (arrived in 2.29.3)
 *   2.31.2+         looks for ncclProfiler_v7 first, then v6: binds v6 here
 *
 * The numeric table at the end (NF_LAYOUT) is the LP64 layout those headers give
 * on x86-64 and AArch64; test_nccl_conformance.c checks both this mirror and the
 * project's header against it, from C11 and from C++17.
 */
#ifndef RAILOVER_TEST_NCCL_FACTS_H
#define RAILOVER_TEST_NCCL_FACTS_H

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif
#include <sys/types.h>

/* ncclProfile* event type bits (descriptor `type`, activation mask). */
enum {
  NF_GROUP = 1 << 0,
  NF_COLL = 1 << 1,
  NF_P2P = 1 << 2,
  NF_PROXY_OP = 1 << 3,
  NF_PROXY_STEP = 1 << 4,
  NF_PROXY_CTRL = 1 << 5,
  NF_KERNEL_CH = 1 << 6,
  NF_NET_PLUGIN = 1 << 7,
  NF_GROUP_API = 1 << 8,     /* v5 on */
  NF_COLL_API = 1 << 9,      /* v5 on */
  NF_P2P_API = 1 << 10,      /* v5 on */
  NF_KERNEL_LAUNCH = 1 << 11, /* v5 on */
  NF_CE_COLL = 1 << 12,      /* v6 on */
  NF_CE_SYNC = 1 << 13,      /* v6 on */
  NF_CE_BATCH = 1 << 14      /* v6 on */
};

/* ncclProfilerEventState_t values the driver records. */
enum {
  NF_STATE_PROXY_OP_IN_PROGRESS = 19,
  NF_STATE_PROXY_STEP_SEND_GPU_WAIT = 8,
  NF_STATE_PROXY_CTRL_IDLE = 13,
  NF_STATE_NET_PLUGIN_UPDATE = 21,
  NF_STATE_KERNEL_CH_STOP = 22,
  NF_STATE_GROUP_START_API_STOP = 23
};

typedef int nf_result; /* ncclResult_t; ncclSuccess = 0 */
typedef void (*nf_logger)(int level, unsigned long flags, const char* file, int line,
                          const char* fmt, ...);

/* coll: identical in v4, v5 and v6 up to proto; v5 and v6 append parentGroup. */
#define NF_COLL_MEMBERS         \
  uint64_t seqNumber;           \
  const char* func;             \
  void const* sendBuff;         \
  void* recvBuff;               \
  size_t count;                 \
  int root;                     \
  const char* datatype;         \
  uint8_t nChannels;            \
  uint8_t nWarps;               \
  const char* algo;             \
  const char* proto;

#define NF_PROXY_OP_MEMBERS \
  pid_t pid;                \
  uint8_t channelId;        \
  int peer;                 \
  int nSteps;               \
  int chunkSize;            \
  int isSend;

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct { NF_COLL_MEMBERS } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct { NF_PROXY_OP_MEMBERS } proxyOp;
    struct { int step; } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  } u;
} nf_descr_v4;

/* The union members v5 and v6 share. */
#define NF_V5_UNION_MEMBERS          \
  struct {                           \
    bool graphCaptured;              \
    int groupDepth;                  \
  } groupApi;                        \
  struct {                           \
    const char* func;                \
    size_t count;                    \
    const char* datatype;            \
    int root;                        \
    void* stream;                    \
    bool graphCaptured;              \
  } collApi;                         \
  struct {                           \
    const char* func;                \
    size_t count;                    \
    const char* datatype;            \
    void* stream;                    \
    bool graphCaptured;              \
  } p2pApi;                          \
  struct { void* stream; } kernelLaunch; \
  struct {                           \
    NF_COLL_MEMBERS                  \
    void* parentGroup;               \
  } coll;                            \
  struct {                           \
    const char* func;                \
    void* buff;                      \
    const char* datatype;            \
    size_t count;                    \
    int peer;                        \
    uint8_t nChannels;               \
    void* parentGroup;               \
  } p2p;                             \
  struct { NF_PROXY_OP_MEMBERS } proxyOp; \
  struct { int step; } proxyStep;    \
  struct {                           \
    uint8_t channelId;               \
    uint64_t pTimer;                 \
  } kernelCh;                        \
  struct {                           \
    int64_t id;                      \
    void* data;                      \
  } netPlugin;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    NF_V5_UNION_MEMBERS
  } u;
} nf_descr_v5;

/* v6: v5's members, then the copy-engine ones (none larger than coll). Later
 * v6 headers also add a kernelStep member, smaller than coll: the layout of
 * everything else, and the union's size, stay as here. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    NF_V5_UNION_MEMBERS
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  } u;
} nf_descr_v6;

/* recordEventState's state arguments (v4; v5 and v6 only append a member). */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} nf_state_args;

/* ncclProfiler_v4_t: init(context, mask, commName, commHash, nNodes, nranks, rank, logfn). */
typedef struct {
  const char* name;
  nf_result (*init)(void** context, int* eActivationMask, const char* commName,
                    uint64_t commHash, int nNodes, int nranks, int rank, nf_logger logfn);
  nf_result (*startEvent)(void* context, void** eHandle, nf_descr_v4* eDescr);
  nf_result (*stopEvent)(void* eHandle);
  nf_result (*recordEventState)(void* eHandle, int eState, nf_state_args* eStateArgs);
  nf_result (*finalize)(void* context);
} nf_profiler_v4;

/* ncclProfiler_v5_t and _v6_t: commId moves first, before the mask. */
#define NF_PROFILER_V5_SHAPE(descr)                                                         const char* name;                                                                         nf_result (*init)(void** context, uint64_t commId, int* eActivationMask,                                    const char* commName, int nNodes, int nranks, int rank, nf_logger logfn);   nf_result (*startEvent)(void* context, void** eHandle, descr* eDescr);                    nf_result (*stopEvent)(void* eHandle);                                                    nf_result (*recordEventState)(void* eHandle, int eState, nf_state_args* eStateArgs);      nf_result (*finalize)(void* context);

typedef struct { NF_PROFILER_V5_SHAPE(nf_descr_v5) } nf_profiler_v5;
typedef struct { NF_PROFILER_V5_SHAPE(nf_descr_v6) } nf_profiler_v6;

/* The LP64 numbers NCCL's headers give (x86-64, AArch64). */
#define NF_V4_SIZE 104
#define NF_V5_SIZE 112
#define NF_V6_SIZE 112
#define NF_OFF_TYPE 0
#define NF_OFF_PARENT 8
#define NF_OFF_RANK 16
#define NF_OFF_UNION 24
#define NF_OFF_SEQ 24
#define NF_OFF_FUNC 32
#define NF_OFF_SEND 40
#define NF_OFF_RECV 48
#define NF_OFF_COUNT 56
#define NF_OFF_ROOT 64
#define NF_OFF_DATATYPE 72
#define NF_OFF_NCHANNELS 80
#define NF_OFF_NWARPS 81
#define NF_OFF_ALGO 88
#define NF_OFF_PROTO 96
#define NF_OFF_PARENT_GROUP 104 /* v5, v6 */
#define NF_OFF_KCH_CHANNEL 24
#define NF_OFF_KCH_PTIMER 32
#define NF_TABLE_SIZE 48
#define NF_TABLE_INIT 8
#define NF_TABLE_START 16
#define NF_TABLE_STOP 24
#define NF_TABLE_RECORD 32
#define NF_TABLE_FINALIZE 40

#endif /* RAILOVER_TEST_NCCL_FACTS_H */
