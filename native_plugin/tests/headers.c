/*
 * Every public header in one translation unit, compiled as C11 by gcc and as
 * C++17 by g++ (-x c++), each with -Wall -Wextra -Werror -pedantic: a CCL
 * (NCCL and everything built on it are C++) includes them as they are.
 */
#include "railover_plugin.h"
#include "railover_wire.h"
#include "railover_nccl_abi.h"

RAILOVER_STATIC_ASSERT(sizeof(railover_switch_vote_t) == 32, "vote is 32 bytes");
RAILOVER_STATIC_ASSERT(sizeof(railover_agreement_t) == 32, "agreement is 32 bytes");
RAILOVER_STATIC_ASSERT(RAILOVER_CMD_BALANCE == 6 && RAILOVER_CMD_NVL_TRANSIT == 7, "kinds");
RAILOVER_STATIC_ASSERT(RAILOVER_WIRE_LARGEST_V1_COMMAND_PAYLOAD ==
                           sizeof(railover_wire_command_weights),
                       "largest agent -> plugin payload");
RAILOVER_STATIC_ASSERT(RAILOVER_WIRE_LARGEST_V1_COMMAND_PAYLOAD <= RAILOVER_WIRE_MAX_PAYLOAD,
                       "fits the input buffer");

/* Every name a CCL uses, so a header that stops declaring one fails here. */
unsigned long railover_header_check2(const railoverPlugin_v2_t* api, railover_command_v2_t* c);
unsigned long railover_header_check2(const railoverPlugin_v2_t* api, railover_command_v2_t* c) {
  railover_wire_command_transit t = {0, 1, 40, {0}, {0}};
  return (unsigned long)api->poll_command_v2(NULL, c, sizeof(*c)) + t.mb_per_channel +
         RAILOVER_MSG_COMMAND_WEIGHTS + RAILOVER_MSG_COMMAND_TRANSIT + RAILOVER_WIRE_MAX_TRANSIT;
}

unsigned long railover_header_check3(const railoverPlugin_v3_t* api);
unsigned long railover_header_check3(const railoverPlugin_v3_t* api) {
  railover_config_v3_t cfg;
  railover_wire_hello_v2 hello = {0, 1, RAILOVER_PLUGIN_ABI_VERSION, 0, 0, {0}};
  void* handle = NULL;
  cfg.base.socket_path = NULL;
  cfg.job_id = "job";
  cfg.incarnation = 1;
  return (unsigned long)api->init_v3(&cfg, sizeof(cfg), NULL, &handle) + hello.abi_version +
         RAILOVER_WIRE_JOB_LEN + RAILOVER_WIRE_VERSION + RAILOVER_WIRE_VERSION_MIN;
}

unsigned long railover_header_check(const railoverPlugin_v1_t* api);
unsigned long railover_header_check(const railoverPlugin_v1_t* api) {
  railover_wire_ack_at ack = {1, RAILOVER_ACK_TOO_LATE, 2, 3};
  railover_switch_vote_t vote = {0, 0, 0, 0, RAILOVER_CMD_REBALANCE};
  railover_agreement_t out;
  railover_agree_outcome_t outcome = RAILOVER_AGREE_APPLY;
  railover_agree_action_t action = RAILOVER_ACT_COMMIT;
  railover_status_t ok = RAILOVER_OK;
  railover_config_t cfg;
  cfg.rank = RAILOVER_RANK_UNKNOWN;
  (void)cfg;
  int rc = api->agree(&vote, 1, 0, &out);
  return (unsigned long)rc + (unsigned long)ack.ops_done + (unsigned long)outcome +
         (unsigned long)action + (unsigned long)ok + RAILOVER_MSG_ACK_AT +
         RAILOVER_PLUGIN_ABI_VERSION + RAILOVER_WIRE_LARGEST_V1_PAYLOAD;
}
