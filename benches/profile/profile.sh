#!/bin/bash
# Where a request's time goes: recall (memory) and the naive hop side by
# side behind wrk, against nginx answering a fixed chat.completion (an
# upstream that costs next to nothing). docs/perf-journal.md, item 24, has what it
# showed and how to read it.
#
#   bash benches/profile/profile.sh [seconds]
#
# Needs perf, wrk, nginx, strace, valgrind and inferno (cargo install
# inferno). Builds both with frame pointers and line tables into
# /tmp/recall-profile/target; writes everything to /tmp/recall-profile.
# Per path: perf stat (CPU, context switches, system calls, wakeups per
# request), allocator calls per request (uprobes on mimalloc), a perf
# profile with DWARF call graphs split by layer (layers.py), a flame graph,
# system calls by kind (strace -c), and instructions per request under
# callgrind (50 sessions, so that every window is full).
set -euo pipefail
secs=${1:-5}
here=$(cd "$(dirname "$0")" && pwd)
out=/tmp/recall-profile
mkdir -p "$out"
cd "$here/../.."
CARGO_TARGET_DIR=$out/target RUSTFLAGS="-C force-frame-pointers=yes" \
  CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  cargo build --release --bin recall --example naive_hop
recall=$out/target/release/recall
hop=$out/target/release/examples/naive_hop

sed "s#@DIR@#$out#g" "$here/nginx.conf.in" > "$out/nginx.conf"
nginx -c "$out/nginx.conf"
cat > "$out/recall.toml" <<TOML
[server]
listen = "127.0.0.1:18002"
worker_threads = 1
[session]
ttl_secs = 0
max_sessions = 1000000
[storage]
backend = "memory"
[log]
level = "warn"
[[upstreams]]
name = "mock"
base_url = "http://127.0.0.1:18001/v1"
TOML
"$recall" --config "$out/recall.toml" > "$out/recall.log" 2>&1 &
rpid=$!
"$hop" --upstream http://127.0.0.1:18001/v1 --listen 127.0.0.1:18003 --threads 1 > "$out/hop.log" 2>&1 &
hpid=$!
cleanup() {
  kill $rpid $hpid 2>/dev/null || true
  nginx -c "$out/nginx.conf" -s stop 2>/dev/null || true
  perf probe -q -d 'probe_recall:*' 2>/dev/null || true
  perf probe -q -d 'probe_naive_hop:*' 2>/dev/null || true
}
trap cleanup EXIT
sleep 1

requests() { grep -oP '^\s*\K\d+(?= requests in)' "$1"; }
load() { # port lua seconds output
  wrk -t1 -c16 -d"$3"s -s "$here/$2" "http://127.0.0.1:$1" > "$4"
}

for path in "recall $rpid 18002 delta.lua" "hop $hpid 18003 delta.lua" "hop-resend $hpid 18003 resend.lua"; do
  set -- $path
  name=$1 pid=$2 port=$3 lua=$4
  exe=$recall; group=probe_recall
  if [ "$name" != recall ]; then exe=$hop; group=probe_naive_hop; fi
  echo "== $name"
  load "$port" "$lua" 2 /dev/null # warm up: fills the windows
  perf stat -x, -e task-clock,context-switches,raw_syscalls:sys_enter,sched:sched_wakeup \
    -p "$pid" -o "$out/$name.stat" -- sleep "$secs" &
  bg=$!; load "$port" "$lua" "$secs" "$out/$name.wrk"; wait $bg
  n=$(requests "$out/$name.wrk")
  # task-clock is in milliseconds.
  awk -F, -v n="$n" '!/^#/ && NF>2 {printf "  %-26s %10.3f per request\n", $3, $1/n}' "$out/$name.stat"
  for f in malloc zalloc realloc; do
    perf probe -q -x "$exe" --add "${f}=mi_${f}_aligned" 2>/dev/null || true
  done
  perf stat -x, -e "$group:*" -p "$pid" -o "$out/$name.alloc" -- sleep 3 &
  bg=$!; load "$port" "$lua" 3 "$out/$name.alloc.wrk"; wait $bg
  n=$(requests "$out/$name.alloc.wrk")
  awk -F, -v n="$n" '!/^#/ && NF>2 {printf "  %-26s %10.1f per request\n", $3, $1/n}' "$out/$name.alloc"
  perf record -q -e "$group:malloc" --call-graph dwarf,16384 -p "$pid" -o "$out/$name.alloc.data" -- sleep 2 &
  bg=$!; load "$port" "$lua" 2 "$out/$name.allocs.wrk"; wait $bg
  # Shares only: recording every allocation's stack slows the process
  # down, so the requests in this window say nothing about the count.
  echo "  allocations by layer:"
  perf script --no-inline -F ip,sym -i "$out/$name.alloc.data" 2>/dev/null \
    | python3 "$here/layers.py" | sed 's/^/    /'
  perf probe -q -d "$group:*" || true
  perf record -q -F 1999 --call-graph dwarf,16384 -p "$pid" -o "$out/$name.cpu.data" -- sleep "$secs" &
  bg=$!; load "$port" "$lua" "$secs" /dev/null; wait $bg
  echo "  CPU by layer:"
  perf script --no-inline -F ip,sym -i "$out/$name.cpu.data" 2>/dev/null | python3 "$here/layers.py" | sed 's/^/    /'
  perf script --no-inline -i "$out/$name.cpu.data" 2>/dev/null | inferno-collapse-perf \
    | inferno-flamegraph --title "$name, non-streaming, full load" > "$out/$name.svg"
  timeout $((secs + 1)) strace -c -f -p "$pid" -o "$out/$name.strace" &
  bg=$!; sleep 0.5; load "$port" "$lua" "$((secs - 1))" "$out/$name.strace.wrk"; wait $bg || true
  echo "  system calls in $(requests "$out/$name.strace.wrk") requests:"
  sed -n '3,8p' "$out/$name.strace" | awk '{print "    " $4 " " $NF}'
done
kill $rpid $hpid; wait $rpid $hpid 2>/dev/null || true

# Instructions per request: deterministic, where the times above move with
# whatever else the machine runs.
for name in recall hop hop-resend; do
  lua=delta.lua; [ "$name" = hop-resend ] && lua=resend.lua
  if [ "$name" = recall ]; then
    sed 's/18002/18012/' "$out/recall.toml" > "$out/cg.toml"
    valgrind -q --tool=callgrind --callgrind-out-file="$out/$name.cg" "$recall" --config "$out/cg.toml" &
  else
    valgrind -q --tool=callgrind --callgrind-out-file="$out/$name.cg" "$hop" \
      --upstream http://127.0.0.1:18001/v1 --listen 127.0.0.1:18012 --threads 1 &
  fi
  vpid=$!
  until curl -s -o /dev/null http://127.0.0.1:18012/; do sleep 0.5; done
  SESSIONS=50 load 18012 "$lua" 4 /dev/null
  callgrind_control -z $vpid > /dev/null
  SESSIONS=50 load 18012 "$lua" 8 "$out/$name.cg.wrk"
  callgrind_control -d $vpid > /dev/null
  kill $vpid; wait $vpid 2>/dev/null || true
  ir=$(callgrind_annotate "$out/$name.cg.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1; exit}')
  echo "== $name: $((ir / $(requests "$out/$name.cg.wrk"))) instructions per request (callgrind)"
done
