#!/usr/bin/env bash
# podman, with the settings sandboxes like this project's CI machine need and ordinary
# machines do not. Hybrid (v1) cgroups: crun refuses them, so use runc and cgroupfs; such
# sandboxes also refuse the rlimits podman sets by default. Decided per run, or forced
# with RAILOVER_PODMAN_SANDBOX=1 / 0.
set -euo pipefail
sandbox=${RAILOVER_PODMAN_SANDBOX:-auto}
if [ "$sandbox" = auto ]; then
  if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then sandbox=0; else sandbox=1; fi
fi
if [ "$sandbox" = 1 ]; then
  conf="${TMPDIR:-/tmp}/railover-containers-$(id -u).conf"
  if [ ! -s "$conf" ]; then
    printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\n' >"$conf.$$"
    mv "$conf.$$" "$conf"
  fi
  export CONTAINERS_CONF="$conf"
  exec podman --runtime runc --cgroup-manager cgroupfs "$@"
fi
exec podman "$@"
