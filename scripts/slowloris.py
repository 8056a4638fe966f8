#!/usr/bin/env python3
"""Half-open connections against a running `edge-llm serve` (issue 12's slowloris figure).

Opens WAVES x PER_WAVE connections, each sending `GET /health HTTP/1.1\\r\\n` and nothing
more (each wave in its own process, so no process needs more than PER_WAVE files), keeps
them open, and meanwhile times `/health` on fresh connections and counts the server's open
files (/proc/PID/fd). Prints one JSON object.

    scripts/slowloris.py --port 8080 --pid $(pgrep -n edge-llm) --waves 2 --per-wave 10000
"""
import argparse, json, multiprocessing as mp, os, resource, socket, time


def hold(port, n, ready, done):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
    socks, failed = [], 0
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\n")
            socks.append(s)
        except OSError:
            failed += 1
    ready.put((len(socks), failed))
    done.wait()
    # How many the server closed meanwhile (reads EOF or reset).
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    ready.put(closed)


def health(port):
    t = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = s.recv(64)
        ok = data.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    return ok, time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--per-wave", type=int, default=10000)
    ap.add_argument("--hold-seconds", type=float, default=5)
    a = ap.parse_args()
    fds = lambda: len(os.listdir(f"/proc/{a.pid}/fd"))
    out = {"files_before": fds(), "waves": []}
    done = mp.Event()
    procs = []
    for w in range(a.waves):
        q = mp.Queue()
        p = mp.Process(target=hold, args=(a.port, a.per_wave, q, done))
        p.start()
        opened, failed = q.get()
        procs.append((p, q))
        checks = [health(a.port) for _ in range(5)]
        out["waves"].append({
            "opened": opened, "connect_failed": failed, "server_files": fds(),
            "health_ok": sum(ok for ok, _ in checks),
            "health_max_s": round(max(t for _, t in checks), 3),
        })
    t_end = time.monotonic() + a.hold_seconds
    worst, fails, peak = 0.0, 0, 0
    while time.monotonic() < t_end:
        ok, t = health(a.port)
        worst, fails, peak = max(worst, t), fails + (not ok), max(peak, fds())
        time.sleep(0.2)
    out.update(held_health_max_s=round(worst, 3), held_health_failures=fails, held_server_files_peak=peak)
    done.set()
    out["closed_by_server"] = sum(q.get() for _, q in procs)
    for p, _ in procs:
        p.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
