// A C++17 program that uses the plugin as a C++ CCL would: resolve the table,
// init without an agent, report, decide a round with agree(), answer with
// ack_command_at, read the counters, finalize. Built -Wall -Wextra -Werror.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "railover_plugin.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL test_cxx: %s\n", what);
    std::exit(1);
  }
}

}  // namespace

int main() {
  const railoverPlugin_v1_t* api = &railoverPlugin_v1;
  check(api->abi_version == 1, "abi version");
  // ABI 2 from C++: the newer table and its command struct.
  const railoverPlugin_v2_t* api2 = &railoverPlugin_v2;
  check(api2->abi_version == 2 && api2->poll_command_v2 != nullptr, "abi 2 table");
  // ABI 3 from C++: the job a process belongs to, given at init.
  const railoverPlugin_v3_t* api3 = &railoverPlugin_v3;
  check(api3->abi_version == RAILOVER_PLUGIN_ABI_VERSION && api3->init_v3 != nullptr,
        "abi 3 table");
  static_assert(sizeof(railover_wire_hello_v2) == 280, "hello v2 size");
  {
    railover_config_v3_t cfg3;
    std::memset(&cfg3, 0, sizeof(cfg3));
    cfg3.base.socket_path = "/nonexistent/railover-test-cxx.sock";
    cfg3.base.ring_size = 16;
    cfg3.base.rank = 1;
    cfg3.job_id = "llm-7";
    cfg3.incarnation = 2;
    void* h3 = nullptr;
    check(api3->init_v3(&cfg3, sizeof(cfg3), nullptr, &h3) == RAILOVER_OK && h3 != nullptr,
          "init_v3");
    check(api3->finalize(h3) == RAILOVER_OK, "finalize v3");
  }
  static_assert(sizeof(railover_command_v2_t) == 448, "command v2 size");
  static_assert(sizeof(railover_wire_command_weights) == 272, "weights frame size");
  check(std::strcmp(api->name, "railover") == 0, "name");

  railover_config_t cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.socket_path = "/nonexistent/railover-test-cxx.sock";
  cfg.ring_size = 16;
  cfg.rank = 0;
  cfg.comm_id = 7;
  void* handle = nullptr;
  check(api->init(&cfg, nullptr, &handle) == RAILOVER_OK && handle != nullptr, "init");
  check(api->report_progress(handle, 7, 0, 1) == RAILOVER_OK, "report before any agent is kept");
  check(api->ack_command_at(handle, 1, RAILOVER_ACK_TOO_LATE, 5) == RAILOVER_DROPPED,
        "an answer with no agent is dropped");

  std::vector<railover_switch_vote_t> votes(8);
  for (auto& v : votes) {
    v.ops_done = 10;
    v.switch_at = 12;
    v.disabled_channels = 0x3;
    v.epoch = 4;
    v.kind = RAILOVER_CMD_REBALANCE;
  }
  railover_agreement_t out;
  check(api->agree(votes.data(), static_cast<uint32_t>(votes.size()), 5, &out) == RAILOVER_OK,
        "agree");
  check(out.outcome == RAILOVER_AGREE_APPLY && out.action == RAILOVER_ACT_COMMIT &&
            out.epoch == 4 && out.switch_at == 12,
        "every rank armed: apply");
  votes[2].ops_done = 13;
  check(api->agree(votes.data(), static_cast<uint32_t>(votes.size()), 5, &out) == RAILOVER_OK &&
            out.outcome == RAILOVER_AGREE_REJECT && out.action == RAILOVER_ACT_TOO_LATE,
        "one rank past N: nobody applies");

  railover_stats_t s;
  check(api->stats(handle, &s, sizeof(s)) == RAILOVER_OK, "stats");
  check(s.queued == 1 && s.dropped_no_agent == 0 && s.acks_dropped == 1, "counters");
  check(api->finalize(handle) == RAILOVER_OK, "finalize");
  std::printf("test_cxx: ok\n");
  return 0;
}
