#!/usr/bin/env python3
"""What the hostile documents of issue 6 cost a running server: time to answer, answer size, and the
server's resident memory before and after.

    python3 scripts/abuse-costs.py [path/to/pulse]     # default target/release/pulse

Starts the given `pulse` binary on a free loopback port with a throwaway SQLite file and its own Redis
key prefix (Redis on 127.0.0.1:6379), sends each case once, prints a table, and stops the server.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("content-type", "application/json")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            data = response.read()
    except urllib.error.HTTPError as err:
        data = err.read()
    return time.monotonic() - started, data


def bomb(levels):
    parts = ["query Bomb { ...F0 }"]
    for level in range(levels):
        parts.append(f"fragment F{level} on Query {{ ...F{level + 1} ...F{level + 1} }}")
    parts.append(f"fragment F{levels} on Query {{ viewer {{ id }} }}")
    return " ".join(parts)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/pulse"
    data_dir = tempfile.mkdtemp(prefix="pulse-abuse-")
    port = free_port()
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": f"sqlite://{data_dir}/pulse.sqlite?mode=rwc",
        "REDIS_URL": "redis://127.0.0.1:6379",
        "PULSE_REDIS_PREFIX": f"pulse-abuse:{port}:",
        "PULSE_LISTEN": f"127.0.0.1:{port}",
        "PULSE_DATA_DIR": data_dir,
        "PULSE_TOKEN_SECRET": "abuse-costs-secret-abuse-costs-secret",
        "RUST_LOG": "warn",
    })
    server = subprocess.Popen([binary, "serve"], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        cases = [
            ("list nested 3,000 deep", {"query": "{article(id:" + "[" * 3000 + "1" + "]" * 3000 + "){id}}"}),
            ("objects nested 1,500 deep", {"query": "{article(id:" + "{a:" * 1500 + "1" + "}" * 1500 + "){id}}"}),
            ("fragment bomb, 24 levels", {"query": bomb(24)}),
            ("fragment bomb, 30 levels", {"query": bomb(30)}),
            ("5,000 duplicate directives", {"query": "{ ... " + "@include(if: true) " * 5000 + "{ viewer { id } } }"}),
        ]
        print(f"{'case':<44} {'answer ms':>10} {'answer B':>10} {'RSS before':>11} {'RSS after':>10}")
        for name, body in cases:
            before = rss_mib(server.pid)
            seconds, data = post(base + "/graphql", body)
            print(f"{name:<44} {seconds * 1000:>10.1f} {len(data):>10} {before:>10.1f}M {rss_mib(server.pid):>9.1f}M")
        before = rss_mib(server.pid)
        started = time.monotonic()
        for i in range(200):
            name = "N" + str(i) + "x" * 250_000
            post(base + "/graphql", {"query": f"query {name} {{ viewer {{ id }} }}"})
        sent = time.monotonic() - started
        scrape_started = time.monotonic()
        metrics = urllib.request.urlopen(base + "/metrics", timeout=600).read()
        scrape = time.monotonic() - scrape_started
        print(f"{'200 operations named with 250 KB each':<44} {sent * 1000:>10.1f} {'':>10} {before:>10.1f}M {rss_mib(server.pid):>9.1f}M")
        print(f"{'/metrics scrape after them':<44} {scrape * 1000:>10.1f} {len(metrics):>10}")
        print(f"server still running: {server.poll() is None}")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
