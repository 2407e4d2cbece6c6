"""What the kernel prints in the sysfs files a fixture node holds.

The PCI identities of the parts a GPU node is built from, the port state strings
as ib_core prints them, and the counters an mlx5 port exposes: the vocabulary
``sysfs_node`` builds trees with and ``sysfs_faults`` changes them with.
"""

from __future__ import annotations

# PCI identities of the parts a current GPU node is built from.
NVIDIA_VENDOR = "0x10de"
H100_SXM_DEVICE = "0x2330"
NVSWITCH_DEVICE = "0x22a3"
MELLANOX_VENDOR = "0x15b3"
CX7_DEVICE = "0x1021"
BROADCOM_VENDOR = "0x1000"
PEX_SWITCH_DEVICE = "0xc030"
INTEL_VENDOR = "0x8086"
ROOT_PORT_DEVICE = "0x352a"

CLASS_3D_CONTROLLER = "0x030200"
CLASS_PCI_BRIDGE = "0x060400"
CLASS_OTHER_BRIDGE = "0x068000"
CLASS_INFINIBAND = "0x020700"
CLASS_ETHERNET = "0x020000"

GEN5 = "32.0 GT/s PCIe"
GEN4 = "16.0 GT/s PCIe"

# Port state strings exactly as ib_core prints them.
PORT_STATES = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "Phy Test": 7,
}

# The counters an mlx5 port exposes (names as in drivers/infiniband/core/sysfs.c
# and drivers/infiniband/hw/mlx5/counters.c); values start at NodeSpec.counter_start.
IB_COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)
# A RoCE port has no InfiniBand PMA behind these; the kernel prints this text.
NO_PMA = "N/A (no PMA)"
ROCE_NO_PMA_COUNTERS = ("VL15_dropped", "link_downed", "symbol_error", "port_xmit_wait")
