"""Fifty-seventh session: the HTTP layer's own latency at one connection on this box (python bench/results/session57/waitress_floor.py
from the repository root): http.client keep-alive round trips (p50, p99 in µs) against the node's HttpServer (waitress)
with a WSGI app that answers at once ("plain"), one that first runs a no-op coroutine on an asyncio loop in another
thread as the gateway does ("hop"), and a bare threaded socket server that answers each read ("raw")."""
import asyncio, threading, time, http.client, statistics, sys
sys.path.insert(0, ".")
from inferbus.actors._http import HttpServer
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
async def noop(): return b"ok"
def app_plain(environ, sr):
    sr("200 OK", [("Content-Length", "2")]); return [b"ok"]
def app_hop(environ, sr):
    r = asyncio.run_coroutine_threadsafe(noop(), loop).result(5)
    sr("200 OK", [("Content-Length", "2")]); return [r]
def lat(port, n=3000):
    c = http.client.HTTPConnection("127.0.0.1", port)
    ts=[]
    for i in range(n):
        t=time.perf_counter(); c.request("POST","/x",b"{}"); r=c.getresponse(); r.read(); ts.append(time.perf_counter()-t)
    ts.sort(); return round(ts[len(ts)//2]*1e6), round(ts[int(len(ts)*.99)]*1e6)
for name, app in (("plain", app_plain), ("hop", app_hop), ("plain", app_plain), ("hop", app_hop)):
    s = HttpServer.start(app, "127.0.0.1", 0)
    print(name, lat(s.port)); s.stop()
# raw socket floor: a threaded echo-ish server
import socket
srv = socket.socket(); srv.bind(("127.0.0.1",0)); srv.listen()
def serve():
    conn,_ = srv.accept()
    while True:
        d = conn.recv(65536)
        if not d: return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
threading.Thread(target=serve, daemon=True).start()
print("raw", lat(srv.getsockname()[1]))
