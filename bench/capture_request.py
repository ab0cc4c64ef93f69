"""capture_request.py COUNT: the request heads of COUNT HTTP requests.

Used by bench/run.lua to check that the plain C contenders put the same
bytes on the wire as rw.fetch. Listens on a free port of 127.0.0.1, prints
the port, then for each of COUNT connections reads the request head, answers
200 "ok" with Connection: close, and prints the head (CRLFs as newlines)
followed by a line "----". Gives up after 10 s without a connection.
"""
import socket
import sys


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(10)
    print(server.getsockname()[1], flush=True)
    for _ in range(count):
        conn, _ = server.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        print(head.replace("\r\n", "\n") + "\n----", flush=True)


if __name__ == "__main__":
    main()
