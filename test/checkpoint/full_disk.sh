#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs full_disk.cpp's job on a tmpfs of 1.5 MiB (room for one checkpoint of its 1 MiB state, not
# two), mounted for the test and unmounted after. Skipped (77) where no tmpfs can be mounted (not
# root, or a container without the right); the injected write failure of checkpointer.cpp runs
# everywhere.
#
#   full_disk.sh MPIEXEC RANKS FULL_DISK WORK
set -euo pipefail
mpiexec=$1 ranks=$2 program=$3 work=$4
mkdir -p "$work"
if ! mount -t tmpfs -o size=1536k cohort-full-disk "$work" 2>/dev/null; then
  echo "full_disk.sh: cannot mount a tmpfs on $work (needs root): skipped"
  exit 77
fi
trap 'umount "$work"' EXIT
timeout --kill-after=5 60 "$mpiexec" -n "$ranks" "$program" "$work/checkpoints"
