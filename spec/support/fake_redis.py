"""A Redis that answers as a spec scripts it (driven by spec/support/fake_redis.lua).

argv[1]: a JSON file, command name (upper case) -> the raw RESP bytes to
answer it with (latin-1); a command not named gets +OK. argv[2]: a file
each command is appended to, its words joined by spaces, one a line.
Prints "<port> <pid>" once listening.
"""
import json
import os
import socketserver
import sys
import threading

with open(sys.argv[1], encoding="utf-8") as replies_file:
    REPLIES = json.load(replies_file)
LOG = sys.argv[2]
LOG_LOCK = threading.Lock()


def read_command(rfile):
    line = rfile.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return line.split()  # an inline command
    words = []
    for _ in range(int(line[1:])):
        size = int(rfile.readline()[1:])
        words.append(rfile.read(size + 2)[:-2])
    return words


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            words = read_command(self.rfile)
            if not words:
                return
            name = words[0].decode("latin-1").upper()
            with LOG_LOCK, open(LOG, "ab") as log:
                log.write(b" ".join(words).replace(b"\n", b" ") + b"\n")
            reply = REPLIES.get(name, "+OK\r\n")
            self.wfile.write(reply.encode("latin-1"))
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], os.getpid(), flush=True)
server.serve_forever()
