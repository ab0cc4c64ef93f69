"""capture_request.py COUNT [--tls CERT KEY [--h2]]: the request heads of COUNT HTTP requests.

Used by bench/run.lua and bench/http2.lua to check that the plain C
contenders put the same bytes on the wire as rw.fetch. Listens on a free
port of 127.0.0.1, prints the port, then for each of COUNT connections reads
the request head, answers 200 "ok" and closes, and prints the head (CRLFs as
newlines) followed by a line "----". Gives up after 10 s without a
connection.

--tls CERT KEY: over TLS with that certificate, offering HTTP/1.1 only
(ALPN), so the head is the same text as over plain HTTP.
--h2: offering HTTP/2 only (ALPN "h2"); the head printed is the request's
HEADERS as the server decoded them (HPACK), one "name: value" a line in the
order sent, pseudo-headers first. Needs Debian's python3-h2, so run it with
/usr/bin/python3 (the python3 first on PATH may not see Debian's modules).
"""
import socket
import ssl
import sys


def head_http1(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    if isinstance(conn, ssl.SSLSocket):
        drain(conn)
    return head.replace("\r\n", "\n")


def head_h2(conn):
    import h2.config
    import h2.connection
    import h2.events

    h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="latin-1"))
    h2c.initiate_connection()
    conn.sendall(h2c.data_to_send())
    head = None
    while head is None:
        data = conn.recv(65536)
        if not data:
            return "(the connection closed before a request came)"
        for event in h2c.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                head = "\n".join("%s: %s" % (k, v) for k, v in event.headers)
                h2c.send_headers(event.stream_id, [(":status", "200"), ("content-length", "2")])
                h2c.send_data(event.stream_id, b"ok", end_stream=True)
        conn.sendall(h2c.data_to_send())
    h2c.close_connection()
    conn.sendall(h2c.data_to_send())
    drain(conn)
    return head


def drain(conn):
    """Reads until the client closes: closing with its frames (a SETTINGS
    ack, a WINDOW_UPDATE) unread would reset the connection, and the client
    could see the reset before the answer. A second at most."""
    conn.settimeout(1)
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def main():
    args = sys.argv[1:]
    count = int(args[0]) if args and not args[0].startswith("--") else 1
    context, h2_mode = None, "--h2" in args
    if "--tls" in args:
        i = args.index("--tls")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args[i + 1], args[i + 2])
        context.set_alpn_protocols(["h2"] if h2_mode else ["http/1.1"])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(10)
    print(server.getsockname()[1], flush=True)
    for _ in range(count):
        conn, _ = server.accept()
        conn.settimeout(10)
        if context is not None:
            conn = context.wrap_socket(conn, server_side=True)
        with conn:
            head = head_h2(conn) if h2_mode else head_http1(conn)
        print(head + "\n----", flush=True)


if __name__ == "__main__":
    main()
