#!/bin/sh
# libFuzzer on librailover_plugin.so's wire decoder and command intake (issue 32).
#
#   sh benchmarks/fuzz_plugin.sh [seconds per target]   # default 300
#
# Needs clang with libFuzzer (Debian: apt-get install clang); says so and exits 0
# without it. Each target starts from its committed corpus
# (native_plugin/tests/fuzz/corpus/<target>) and writes new inputs to
# native_plugin/build/fuzz/corpus_<target>, never to the committed one: to keep a
# run's finds, merge them in with
#   native_plugin/build/fuzz/fuzz_<target> -merge=1 native_plugin/tests/fuzz/corpus/<target> \
#       native_plugin/build/fuzz/corpus_<target>
# `make test` replays the committed corpus under ASan+UBSan with gcc (test-fuzz-replay).
set -eu
cd "$(dirname "$0")/.."
exec nice -n 5 make -s -C native_plugin fuzz FUZZ_SECONDS="${1:-300}"
