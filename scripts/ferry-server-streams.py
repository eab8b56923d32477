#!/usr/bin/env python3
"""Holds N streaming GETs open on a running ferry-server and measures it (Benchmarks/README.md, *Many streams*).

usage: ferry-server-streams.py PORT SERVER_PID N

Prints the server's RSS and thread count with N streams open, the time for a write to their
location to be acknowledged and to reach every stream, and the time for 50 clients to have
40 writes each acknowledged elsewhere while the streams stay open.
"""
import http.client, resource, socket, sys, threading, time

port, pid, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

def status():
    return ", ".join(l.strip().replace("\t", " ") for l in open(f"/proc/{pid}/status") if l.startswith(("VmRSS", "Threads")))

def request(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request(method, path, body, {"Connection": "close"})
    r = c.getresponse(); r.read(); c.close()
    return r.status

request("PUT", "/room.json?ns=t", '{"a": 0}')
print("server at start:", status())
t = time.time(); streams = []
for _ in range(n):
    s = socket.socket(); s.connect(("127.0.0.1", port))
    s.sendall(b"GET /room.json?ns=t HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
    streams.append(s)
for s in streams:
    d = b""
    while b"data:" not in d: d += s.recv(65536)
print(f"{n} streams open (first event read) in {time.time() - t:.2f} s; server: {status()}")
for k in range(5):
    t = time.time(); request("PUT", f"/room/k{k}.json?ns=t", "1"); acked = time.time() - t
    for s in streams:
        d = b""
        while b"\n\n" not in d: d += s.recv(65536)
    print(f"write {k}: acknowledged in {acked:.3f} s, on every stream in {time.time() - t:.3f} s")
count = [0]; lock = threading.Lock()
def writer(c):
    for i in range(40):
        if request("PUT", f"/w/c{c}_{i}.json?ns=t&print=silent", "1") == 204:
            with lock: count[0] += 1
t = time.time(); threads = [threading.Thread(target=writer, args=(c,)) for c in range(50)]
for th in threads: th.start()
for th in threads: th.join()
print(f"50 clients x 40 writes elsewhere: {count[0]} acknowledged in {time.time() - t:.2f} s; server: {status()}")
