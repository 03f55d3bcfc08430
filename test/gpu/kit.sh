#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device kit's run half, proven on a machine without a GPU: packs the kit from this build
# (tools/gpu/pack.sh --no-build) and runs it (tools/gpu/run.sh) in a mount namespace where Open
# MPI, PMIx, Boost, xxHash, hwloc, libevent and libudev are hidden, as on the bare device machine,
# so that a library the kit forgot fails here and not on the GPU's clock. Every GPU case must say
# SKIP and every host case PASS. Needs root (unshare); skipped (77) otherwise.
#
#   test/gpu/kit.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(realpath "$1")
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "needs root for a mount namespace: skipped"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/tools/gpu/pack.sh" --no-build --build "$build" --out "$work/kit" > "$work/pack.txt" || {
  cat "$work/pack.txt"
  exit 1
}
tail -n 2 "$work/pack.txt"

# Hidden: folders under an empty tmpfs, files under /dev/null (a library found empty fails to
# load, as one that is not there).
hide_script=$(cat <<'EOF'
set -e
lib=/usr/lib/x86_64-linux-gnu
for d in $lib/openmpi $lib/pmix2 /usr/share/openmpi /etc/openmpi /usr/include/boost; do
  [ -d "$d" ] && mount -t tmpfs none "$d"
done
for f in $lib/lib{mpi,open-rte,open-pal,pmix,boost_,xxhash,hwloc,event,udev,mca_common_}* \
         /usr/bin/{mpirun,mpiexec,orterun,orted,ompi_info} /usr/include/xxhash.h; do
  [ -f "$f" ] && [ ! -L "$f" ] && mount --bind /dev/null "$f"
done
# Proof that they are gone: nothing here resolves libmpi or Boost.MPI any more.
if ldd "$KIT/bin/bench_gpu_info" | grep -E 'libmpi|boost' | grep -v "$KIT" | grep -vq 'not found'; then
  echo "kit.sh: Open MPI or Boost still visible outside the kit" >&2
  exit 1
fi
exec "$RUN" "$KIT"
EOF
)
set +e
OUT=$work/out KIT=$work/kit RUN=$root/tools/gpu/run.sh \
  unshare -m --propagation private bash -c "$hide_script" > "$work/run.txt" 2>&1
rc=$?
set -e
cat "$work/run.txt"
last=$(tail -n 1 "$work/run.txt")
fail() {
  echo "kit.sh: $*" >&2
  exit 1
}
[ "$rc" = 0 ] || fail "run.sh exited $rc"
[[ "$last" =~ ^([0-9]+)\ passed,\ 0\ failed$ ]] || fail "last line is not 'N passed, 0 failed': $last"
[ "${BASH_REMATCH[1]}" -ge 2 ] || fail "fewer than 2 host cases passed"
grep -E '^PASS gpu\.' "$work/run.txt" && fail "a GPU case passed on a machine without a GPU"
grep -qE '^PASS kernels.host' "$work/run.txt" || fail "the host kernels case did not pass"
grep -qE '^PASS without_device.np2' "$work/run.txt" || fail "the host MPI case did not pass"
skips=$(grep -cE '^SKIP gpu\.' "$work/run.txt" || true)
[ "$skips" -ge 10 ] || fail "only $skips GPU cases said SKIP"
echo "kit.sh: the kit runs with Open MPI, Boost and xxHash hidden: host cases passed, $skips GPU cases skipped"
