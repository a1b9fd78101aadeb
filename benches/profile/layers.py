#!/usr/bin/env python3
"""Where recall's (or the naive hop's) samples fall, by layer.

Reads `perf script --no-inline -F ip,sym` (one stack per sample, leaf
first, blank line between) on stdin: CPU samples, or the allocator's uprobe
hits. Each sample goes to the layer of the frame nearest its leaf that names
one; a sample inside a system call goes to the kernel, by call. Prints each
layer's share, and per request when the number of requests is given.

usage: perf script --no-inline -F ip,sym -i perf.data | layers.py [requests]
"""
import collections
import re
import sys

# Nearest the leaf first: a serde_json frame under the chat body writer is the
# rewrite's, a malloc under reqwest is reqwest's.
LAYERS = [
    ("vendor rewrite (upstream body)", r"recall_core::exchange::protocol|recall::proxy::vendor|openai_fields"),
    ("render + window", r"recall::memory::(render|window)|Units<"),
    ("session, reconcile, record", r"recall::memory::"),
    ("storage queue", r"recall::store"),
    ("observe middleware", r"recall::api::observe"),
    ("metrics", r"recall::metrics"),
    ("answer parse (accumulate)", r"recall::proxy::accumulate"),
    ("recall upstream + relay", r"recall::proxy"),
    ("chat handler (parse, open)", r"recall::api"),
    ("recall, other", r"recall::"),
    ("naive hop handler", r"naive_hop::"),
    ("reqwest", r"reqwest::"),
    ("hyper client", r"hyper_util::client|hyper::client|dispatch::Client"),
    ("hyper server", r"hyper::|hyper_util::server"),
    ("axum + tower routing", r"axum::|tower::|tower_http::"),
    ("tracing", r"tracing"),
    ("tokio runtime", r"tokio::|mio::"),
]
LAYERS = [(name, re.compile(p)) for name, p in LAYERS]
FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.*)$")


def layer_of(frames):
    syscall = next((f for f in frames if f.startswith(("__x64_sys_", "do_writev", "do_epoll_wait"))), None)
    if syscall:
        name = syscall.split("+")[0].replace("__x64_sys_", "").replace("do_", "")
        return f"kernel: {name}"
    if frames and frames[0].startswith(("asm_", "irq", "__irq", "__do_softirq")):
        return "kernel: interrupts"
    for f in frames:
        for name, pattern in LAYERS:
            if pattern.search(f):
                return name
    return "other (libc, std, allocator)"


def main():
    counts = collections.Counter()
    frames = []
    total = 0
    for line in list(sys.stdin) + [""]:
        m = FRAME.match(line)
        if m:
            frames.append(m.group(1))
        elif not line.strip() and frames:
            counts[layer_of(frames)] += 1
            total += 1
            frames = []
    requests = float(sys.argv[1]) if len(sys.argv) > 1 else 0
    for name, n in counts.most_common():
        per = f"{n / requests:8.1f} per request  " if requests else ""
        print(f"{100 * n / total:6.2f}%  {per}{name}")
    print(f"{total} samples")


if __name__ == "__main__":
    main()
