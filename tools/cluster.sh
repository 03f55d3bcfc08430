#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Turns this one machine into N hosts joined by a network, to run and test MPI jobs across hosts:
# each host a Linux network namespace with a hostname of its own (its own UTS namespace: without
# it the shared-memory segments of two "hosts" collide in Open MPI and ranks crash), joined by a
# bridge on a private subnet that exists only on this machine (the namespaces have no default
# route, so no packet leaves it), each host's link rate-limited with tc (tbf, both directions).
# mpirun (in the root namespace, which has an address on the bridge) starts its daemons in the
# namespaces through an rsh agent that runs `ip netns exec` instead of ssh. Needs root.
#
#   tools/cluster.sh up N [--rate R] [--delay D]   N hosts (host1..hostN); R a tc rate (1gbit,
#                                                  default: unlimited); D a delay (netem: this
#                                                  script fails clearly on a kernel without it)
#   tools/cluster.sh down                          stop every process in the hosts, remove all
#   tools/cluster.sh run K PROGRAM [ARGS...]       mpirun PROGRAM with K ranks on each host
#   tools/cluster.sh mpirun [MPIRUN ARGS...]       mpirun with the cluster's hostfile and settings
#   tools/cluster.sh with N [--rate R] -- COMMAND  up, COMMAND, then down on every exit path
#   tools/cluster.sh exec HOST COMMAND...          run COMMAND on HOST (inside its namespaces)
#   tools/cluster.sh kill HOST                     SIGKILL every process on HOST (a host lost)
#   tools/cluster.sh cut HOST | mend HOST          take HOST's link down, or up again
#   tools/cluster.sh rate HOST R                   reshape HOST's link (both directions) to R
#   tools/cluster.sh status                        the hosts, their links and their processes
#   tools/cluster.sh bytes                         the bytes every host has sent on its link so
#                                                  far, all hosts together (headers included)
#
# COHORT_CLUSTER_NAME (default cohort) names the state directory, bridge and namespaces, so that
# two clusters can coexist; COHORT_CLUSTER_SUBNET (default 10.231.0) is its /24 subnet.
set -euo pipefail

name=${COHORT_CLUSTER_NAME:-cohort}
subnet=${COHORT_CLUSTER_SUBNET:-10.231.0}
state=/run/$name-cluster
# Interface names have at most 15 characters: the bridge's and the veths' carry a short hash of
# the cluster's name instead of the name itself, so that two clusters never share one.
tag=$(printf '%s' "$name" | cksum | awk '{ printf "%05x", $1 % 1048576 }')
bridge=cl$tag-br
launcher_address=$subnet.254
self=$(readlink -f "${BASH_SOURCE[0]}")

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}
netns_of() { echo "$name-$1"; }
veth_of() { echo "cl$tag-v${1#host}"; } # the root side of a host's link
hosts() { cat "$state/hosts" 2>/dev/null || true; }
require_up() { [ -f "$state/hosts" ] || die "no cluster is up (tools/cluster.sh up N)"; }
require_host() {
  require_up
  grep -qx "$1" "$state/hosts" || die "no host '$1' in this cluster (hosts: $(hosts | xargs))"
}

# A tbf burst of 4 ms at the rate (at least 64 KiB, more than one GSO segment), and a queue of
# 100 ms: TCP then sees a link, not a policer dropping every burst (1 Gbit/s measured 954 Mbit/s
# of TCP). The price: a link idle for 4 ms sends its next 4 ms worth (500 KB at 1 Gbit/s) at
# memory speed, as a real link does not. A burst of 1 ms cut TCP to 75% of the rate (2 x 2: 90
# against 119 MB/s), a worse link for every size.
shape() { # DEVICE RATE DELAY [NETNS]
  local device=$1 rate=$2 delay=$3 run=()
  [ -n "${4:-}" ] && run=(ip netns exec "$4")
  "${run[@]}" tc qdisc del dev "$device" root 2>/dev/null || true
  local parent=(root)
  if [ -n "$delay" ]; then
    "${run[@]}" tc qdisc add dev "$device" root handle 1: netem delay "$delay" 2>/dev/null ||
      die "--delay needs the netem qdisc, which this kernel lacks (no module to load here); run without --delay"
    parent=(parent 1:)
  fi
  [ -z "$rate" ] && return 0
  local bits
  bits=$(tc_rate_bits "$rate")
  local burst=$((bits / 8 / 250))
  [ "$burst" -lt 65536 ] && burst=65536
  "${run[@]}" tc qdisc add dev "$device" "${parent[@]}" handle 2: tbf rate "$rate" burst "$burst" \
    latency 100ms || die "tc refused the rate '$rate' on $device"
}
# tc's rate units (bit, kbit, mbit, gbit; k, m, g as bits) as bits per second.
tc_rate_bits() {
  local r=${1,,} n unit
  n=${r%%[a-z]*}
  unit=${r#"$n"}
  [[ "$n" =~ ^[0-9]+$ ]] || die "a rate is a number and a unit (1gbit, 500mbit): '$1'"
  case "$unit" in
    "" | bit) echo "$n" ;;
    k | kbit) echo $((n * 1000)) ;;
    m | mbit) echo $((n * 1000000)) ;;
    g | gbit) echo $((n * 1000000000)) ;;
    *) die "unknown rate unit in '$1' (bit, kbit, mbit, gbit)" ;;
  esac
}

up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, a bridge, tc)"
  local n=${1:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "up N: N hosts, 1 to 64 ('$n')"
  shift
  local rate= delay=
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [ -n "$rate" ] && tc_rate_bits "$rate" >/dev/null
  [ -e "$state" ] && die "a cluster is up already ($state); tools/cluster.sh down first"
  if ip -4 -o addr show | grep -q " inet $subnet\."; then
    die "the subnet $subnet.0/24 is in use on this machine (another cluster?); take it down, or set COHORT_CLUSTER_SUBNET"
  fi
  mkdir -p "$state"
  # A half-made cluster is taken down again, whatever failed.
  trap 'status=$?; [ $status -ne 0 ] && down >/dev/null 2>&1; exit $status' EXIT
  echo "$rate" >"$state/rate"
  echo "$delay" >"$state/delay"
  ip link add "$bridge" type bridge
  ip addr add "$launcher_address/24" dev "$bridge"
  ip link set "$bridge" up
  : >"$state/hostfile"
  : >"$state/etc-hosts"
  for k in $(seq 1 "$n"); do echo "$subnet.$k host$k" >>"$state/etc-hosts"; done
  echo "$launcher_address launcher" >>"$state/etc-hosts"
  for k in $(seq 1 "$n"); do
    local host=host$k netns veth
    netns=$(netns_of "$host")
    veth=$(veth_of "$host")
    ip netns add "$netns"
    echo "$host" >>"$state/hosts"
    mkdir -p "/etc/netns/$netns"
    cp "$state/etc-hosts" "/etc/netns/$netns/hosts"
    touch "$state/$host.uts"
    unshare --uts="$state/$host.uts" hostname "$host"
    ip link add "$veth" type veth peer name eth0 netns "$netns"
    ip link set "$veth" master "$bridge" up
    ip netns exec "$netns" ip addr add "$subnet.$k/24" dev eth0
    ip netns exec "$netns" ip link set eth0 up
    ip netns exec "$netns" ip link set lo up
    shape "$veth" "$rate" "$delay"
    shape eth0 "$rate" "$delay" "$netns"
    # Slots: the machine's cores, so that mpirun never refuses K ranks per host for want of them.
    echo "$host slots=$(nproc)" >>"$state/hostfile"
  done
  trap - EXIT
  echo "cluster '$name': $n hosts (host1..host$n) on $subnet.0/24, links ${rate:-unlimited}${delay:+, delay $delay}"
}

down() {
  local host netns
  # mpirun of this cluster's jobs first: it may wait for a host's daemon it cannot reach.
  pkill -KILL -f -- "--hostfile $state/hostfile" 2>/dev/null || true
  for host in $(hosts); do
    netns=$(netns_of "$host")
    kill_host "$host" 2>/dev/null || true
    ip netns del "$netns" 2>/dev/null || true
    ip link del "$(veth_of "$host")" 2>/dev/null || true
    rm -rf "/etc/netns/$netns"
    umount "$state/$host.uts" 2>/dev/null || true
  done
  # Namespaces left by a state directory lost (a reboot of /run, a crash while going up).
  for netns in $(ip netns list 2>/dev/null | awk -v p="$name-host" 'index($1, p) == 1 { print $1 }'); do
    for pid in $(ip netns pids "$netns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$netns" 2>/dev/null || true
    rm -rf "/etc/netns/$netns"
  done
  ip link del "$bridge" 2>/dev/null || true
  if [ -d "$state" ]; then
    for f in "$state"/*.uts; do [ -e "$f" ] && { umount "$f" 2>/dev/null || true; }; done
    rm -rf "$state"
  fi
}

kill_host() {
  local netns pids
  netns=$(netns_of "$1")
  # Until none is left: a daemon killed may have forked meanwhile.
  for _ in $(seq 1 50); do
    pids=$(ip netns pids "$netns" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  die "processes still run on $1 after 5 s of SIGKILL: $(ip netns pids "$netns" | xargs)"
}

# What mpirun's rsh agent runs, as `agent HOST COMMAND...`: COMMAND on HOST, in a clean
# environment (as ssh gives one), with PATH and the library path of the launching shell.
agent() {
  local host=$1
  shift
  require_host "$host"
  exec ip netns exec "$(netns_of "$host")" nsenter --uts="$state/$host.uts" -- \
    env -i PATH="$PATH" HOME="${HOME:-/root}" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 /bin/sh -c "$*"
}

# The settings that work across these hosts (shared/reference/multihost.md): TCP between hosts
# and shared memory within one (`btl tcp,self` alone would send a host's own traffic over TCP),
# no binding (each host would bind its first rank to core 0: two hosts' ranks on one core), idle
# ranks yielding (2 cores for every rank), and only the cluster's subnet. TCP keepalives on
# mpirun's links to its daemons after 2 s of silence (Open MPI's default: 300 s, then 20 s
# apart): with a host's link cut, mpirun otherwise waits for ever for the daemon it cannot reach,
# after cohort's timeout has ended every rank on both sides.
run_mpirun() {
  require_up
  exec mpirun --hostfile "$state/hostfile" --mca plm_rsh_agent "$self agent" \
    --mca oob_tcp_if_include "$subnet.0/24" --mca btl_tcp_if_include "$subnet.0/24" \
    --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 \
    --mca oob_tcp_keepalive_probes 3 \
    --mca btl tcp,vader,self --mca pml ob1 --mca mpi_yield_when_idle 1 \
    --mca btl_vader_single_copy_mechanism none --bind-to none --oversubscribe \
    --allow-run-as-root "$@"
}

status() {
  require_up
  echo "cluster '$name': links $(cat "$state/rate" | sed 's/^$/unlimited/')"
  local host
  for host in $(hosts); do
    printf '%s  link %s  processes %s\n' "$host" \
      "$(ip -br link show "$(veth_of "$host")" | awk '{ print $2 }')" \
      "$(ip netns pids "$(netns_of "$host")" | wc -l)"
  done
}

# What the hosts sent into the bridge: the root side's received bytes, summed over the links.
sent_bytes() {
  require_up
  local host total=0
  for host in $(hosts); do
    total=$((total + $(cat "/sys/class/net/$(veth_of "$host")/statistics/rx_bytes")))
  done
  echo "$total"
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  up) up "$@" ;;
  down) down ;;
  agent) agent "$@" ;;
  mpirun) run_mpirun "$@" ;;
  run)
    k=${1:-}
    [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] || die "run K PROGRAM: K ranks per host ('$k')"
    shift
    require_up
    run_mpirun -np $(($(hosts | wc -l) * k)) --npernode "$k" "$@"
    ;;
  with)
    args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ "${1:-}" = -- ] || die "with N [--rate R] -- COMMAND"
    shift
    up "${args[@]}"
    trap 'down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "$@"
    ;;
  exec)
    host=${1:?exec HOST COMMAND}
    shift
    require_host "$host"
    exec ip netns exec "$(netns_of "$host")" nsenter --uts="$state/$host.uts" -- "$@"
    ;;
  kill) require_host "${1:?kill HOST}"; kill_host "$1" ;;
  cut) require_host "${1:?cut HOST}"; ip link set "$(veth_of "$1")" down ;;
  mend) require_host "${1:?mend HOST}"; ip link set "$(veth_of "$1")" up ;;
  rate)
    require_host "${1:?rate HOST R}"
    shape "$(veth_of "$1")" "${2:?rate HOST R}" "$(cat "$state/delay")"
    shape eth0 "$2" "$(cat "$state/delay")" "$(netns_of "$1")"
    ;;
  status) status ;;
  bytes) sent_bytes ;;
  *) sed -n '3,27p' "$self" | sed 's/^# \{0,1\}//'; [ -z "$command" ] || exit 2 ;;
esac
