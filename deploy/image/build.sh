#!/usr/bin/env bash
# `make image`: build deploy/image/Containerfile with podman (no daemon).
#   IMAGE   name:tag to build            [railover:<version in pyproject.toml>]
#   BASE    image to build on            [a minimal Debian bookworm made here, see below]
#   WHEELS  1: resolve the Python dependencies on this host (pip wheel) and build
#           without any index; for build hosts whose containers cannot reach PyPI.
# With no BASE, a minimal base is made once from Debian's packages (debootstrap
# --variant=minbase, plus python3) and imported as localhost/railover-base:bookworm,
# because this project's CI machine reaches no container registry. Where one is
# reachable, BASE=docker.io/library/python:3.11-slim builds the same image.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
podman="$root/scripts/podman.sh"
version=$(cd "$root" && python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image=${IMAGE:-railover:$version}
base=${BASE:-}
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
cleanup=()
trap 'for p in "${cleanup[@]}"; do $sudo rm -rf "$p"; done' EXIT

if [ -z "$base" ]; then
  base=localhost/railover-base:bookworm
  if ! "$podman" image exists "$base"; then
    rootfs=$(mktemp -d "${TMPDIR:-/tmp}/railover-rootfs.XXXXXX")
    cleanup+=("$rootfs")
    echo "making $base with debootstrap (once)" >&2
    $sudo debootstrap --variant=minbase --include=python3 bookworm "$rootfs" \
      "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
    $sudo rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    $sudo tar -C "$rootfs" -c . | "$podman" import --change 'CMD ["/bin/sh"]' - "$base" >/dev/null
  fi
fi

args=(--build-arg "BASE=$base" --build-arg "VERSION=$version")
# pip inside the build trusts what pip on this host trusts (a TLS-inspecting proxy's CA).
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ ! -s "$ca" ]; then ca=$(mktemp); cleanup+=("$ca"); fi
args+=(--secret "id=pip-ca,src=$ca")
if [ "${WHEELS:-0}" = 1 ]; then
  "${PYTHON:-python3}" -m pip wheel -q -w "$root/deploy/image/wheels" "$root" setuptools wheel
  args+=(--build-arg PIP_NO_INDEX=1)
fi
"$podman" build -q -f "$root/deploy/image/Containerfile" "${args[@]}" -t "$image" "$root" >/dev/null
echo "$image"
