"""Seed 000's Python SDK (cocoonstack-sandbox, from PyPI) against this project's node.

Usage: silkd_sdk.py ADDR OPERATOR_TOKEN TEMPLATE

Prints one line per check ("ok NAME" or "FAIL NAME: why") and exits non-zero when
any check failed. Keeps at most two sandboxes running at once (the parent and one
child), closing each child before the next is made.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import tarfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

from cocoonsandbox import Client
from cocoonsandbox.errors import APIError, ExitError, SilkdError

FAILURES: list[str] = []


def check(name, fn):
    try:
        fn()
    except Exception as exc:  # every failure is reported, the run goes on
        FAILURES.append(name)
        print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc(file=sys.stdout)
        return
    print(f"ok {name}", flush=True)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def raises(fn, kind_or_type):
    try:
        fn()
    except SilkdError as exc:
        if isinstance(kind_or_type, str):
            expect(exc.kind == kind_or_type, f"error kind {exc.kind!r}, wanted {kind_or_type!r}: {exc}")
            return exc
        raise
    except Exception as exc:
        if isinstance(kind_or_type, type) and isinstance(exc, kind_or_type):
            return exc
        raise
    raise AssertionError(f"no error, wanted {kind_or_type}")


def eventually(fn, what, within=30.0):
    deadline = time.monotonic() + within
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main() -> int:
    addr, token, template = sys.argv[1], sys.argv[2], sys.argv[3]
    client = Client(addr, api_token=token, timeout=600.0)
    sb = client.new(template, ttl_seconds=1800)
    print(f"ok claim {sb.id}", flush=True)

    def exec_and_run():
        expect(sb.exec("echo", "hi") == "hi\n", "echo hi")
        out = bytearray()
        code = sb.run(["cat"], stdin=b"from stdin", on_stdout=out.extend)
        expect(code == 0 and bytes(out) == b"from stdin", f"cat stdin: {code} {bytes(out)!r}")
        expect(sb.exec("cat", stdin=b"x" * 300_000) == "x" * 300_000, "large stdin")
        err = raises(lambda: sb.exec("sh", "-c", "echo out; echo bad >&2; exit 3"), ExitError)
        expect(err.code == 3 and err.stderr == "bad\n" and err.stdout == "out\n", f"exit error {err.code} {err.stderr!r}")
        expect(sb.exec("pwd", cwd="/tmp") == "/tmp\n", "cwd")
        expect(sb.exec("sh", "-c", "echo $FOO", env={"FOO": "bar"}) == "bar\n", "env")
        expect(sb.exec("id", "-u", user="4242").strip() == "4242", "user")

    check("exec_and_run", exec_and_run)

    def processes():
        pid = sb.spawn("sh", "-c", "echo started; sleep 60")
        rows = {row["pid"]: row for row in sb.ps()}
        expect(pid in rows and rows[pid]["state"] == "running" and rows[pid]["detached"], f"ps {rows.get(pid)}")
        seen = bytearray()

        def logged():
            seen.clear()
            return sb.logs(pid, on_stdout=seen.extend) is None and b"started" in seen

        eventually(logged, "spawned output in logs")
        out = bytearray()
        attached = {}
        follower = threading.Thread(target=lambda: attached.update(code=sb.attach(pid, on_stdout=out.extend)))
        follower.start()
        time.sleep(1.0)
        sb.kill(pid)
        follower.join(60)
        expect(attached.get("code") == 137, f"attach after kill: {attached}")
        expect(b"started" in out, f"attach replay {bytes(out)!r}")
        sb.kill(pid)  # already exited: a no-op success
        short = sb.spawn("sh", "-c", "echo bye; exit 4")
        expect(sb.attach(short, on_stdout=out.extend) == 4, "attach to a short process")
        got = bytearray()
        expect(sb.logs(short, on_stdout=got.extend) == 4 and got == b"bye\n", f"logs of an exited process {bytes(got)!r}")
        raises(lambda: sb.kill(999_999), "not_found")

    check("spawn_ps_logs_attach_kill", processes)

    def file_ops():
        sb.mkdir("/tmp/f/a/b", parents=True)
        sb.write_file("/tmp/f/a/one.txt", b"one\n")
        big = bytes(range(256)) * 8192  # 2 MiB: several fs_write chunks
        sb.write_file("/tmp/f/big.bin", big, mode=0o600)
        expect(sb.read_file("/tmp/f/big.bin") == big, "big file round trip")
        expect(sb.read_file("/tmp/f/a/one.txt") == b"one\n", "read")
        names = {e["name"]: e for e in sb.list_dir("/tmp/f")}
        expect(names["a"]["kind"] == "dir" and names["big.bin"]["size"] == len(big), f"list {names}")
        st = sb.stat("/tmp/f/big.bin")
        expect(st["kind"] == "file" and st["size"] == len(big) and st["mode"] & 0o777 == 0o600, f"stat {st}")
        expect(st["mtime_epoch_secs"] > 1_600_000_000, f"mtime {st}")
        sb.rename("/tmp/f/a/one.txt", "/tmp/f/a/two.txt")
        expect(sb.read_file("/tmp/f/a/two.txt") == b"one\n", "rename")
        raises(lambda: sb.read_file("/tmp/f/a/one.txt"), "not_found")
        raises(lambda: sb.stat("/nope"), "not_found")
        sb.remove("/tmp/f/a", recursive=True)
        raises(lambda: sb.stat("/tmp/f/a"), "not_found")
        raises(lambda: sb.read_file("relative/path"), "bad_request")

    check("file_ops", file_ops)

    def push_pull():
        files = {"tree/a.txt": b"alpha\n", "tree/sub/b.txt": b"beta\n"}
        sb.push("/tmp/pushed", tar_of(files))
        expect(sb.read_file("/tmp/pushed/tree/sub/b.txt") == b"beta\n", "pushed file")
        pulled = tarfile.open(fileobj=io.BytesIO(sb.pull("/tmp/pushed/tree")))
        got = {m.name: pulled.extractfile(m).read() for m in pulled.getmembers() if m.isfile()}
        expect(got == {"tree/a.txt": b"alpha\n", "tree/sub/b.txt": b"beta\n"}, f"pulled {got}")
        whole = tar_of({"big.bin": b"z" * 3_000_000})
        raises(lambda: sb.push("/tmp/truncated", whole[: len(whole) // 2]), "bad_request")
        raises(lambda: sb.stat("/tmp/truncated"), "not_found")
        # A push whose connection dies before data_end.
        conn = sb._dial()
        conn.send("fs_push", dest="/tmp/cut")
        conn.send("data", data=whole[:100_000])
        conn.close()
        time.sleep(1.0)
        raises(lambda: sb.stat("/tmp/cut"), "not_found")
        leftovers = [e["name"] for e in sb.list_dir("/tmp") if e["name"].startswith(".silkd-push")]
        expect(not leftovers, f"temp archives left: {leftovers}")

    check("push_pull_tree", push_pull)

    def find_replace():
        sb.mkdir("/tmp/s/d", parents=True)
        sb.write_file("/tmp/s/a.py", b"x = 1\nneedle = 2\n")
        sb.write_file("/tmp/s/d/b.txt", b"needle needle\nno\n")
        found = sorted((m["file"], m["line"]) for m in sb.find("/tmp/s", r"need\w+"))
        expect(found == [("/tmp/s/a.py", 2), ("/tmp/s/d/b.txt", 1)], f"find {found}")
        only_py = [m["file"] for m in sb.find("/tmp/s", "needle", glob="*.py")]
        expect(only_py == ["/tmp/s/a.py"], f"glob {only_py}")
        replaced = sb.replace(["/tmp/s/d/b.txt", "/tmp/s/a.py"], r"need(le)", r"pin$1")
        counts = {r["file"]: r["replacements"] for r in replaced}
        expect(counts == {"/tmp/s/d/b.txt": 2, "/tmp/s/a.py": 1}, f"replace {counts}")
        expect(sb.read_file("/tmp/s/d/b.txt") == b"pinle pinle\nno\n", "replaced content")
        raises(lambda: sb.find("/tmp/s", "("), "bad_request")

    check("find_replace", find_replace)

    def watch():
        sb.mkdir("/tmp/w", parents=True)
        watcher = sb.watch("/tmp/w")
        events = []

        def collect():
            for event in watcher:
                events.append(event)
                if event["path"] == "/tmp/w/new.txt" and event["kind"] == "created":
                    return

        reader = threading.Thread(target=collect, daemon=True)
        reader.start()
        sb.write_file("/tmp/w/new.txt", b"hello")
        reader.join(30)
        watcher.close()
        expect(any(e["kind"] == "created" and e["path"] == "/tmp/w/new.txt" for e in events), f"events {events}")

    check("watch_sees_a_new_file", watch)

    def session():
        sb.mkdir("/tmp/sessdir", parents=True)
        s = sb.session(cwd="/tmp", env={"START": "s0"})
        expect(s.exec("pwd") == "/tmp\n", "session cwd")
        s.exec("cd", "/tmp/sessdir")
        s.exec("export", "FOO=kept")
        expect(s.exec("pwd") == "/tmp/sessdir\n", "cd persists")
        expect(s.exec("sh", "-c", "echo $FOO $START") == "kept s0\n", "export persists")
        expect(s.id in sb.sessions(), f"sessions {sb.sessions()}")
        err = raises(lambda: s.exec("sh", "-c", "exit 5"), ExitError)
        expect(err.code == 5, f"session exit {err.code}")
        s.close()
        expect(s.id not in sb.sessions(), "session closed")
        s.close()  # already gone: not an error

    check("session_keeps_cd_and_export", session)

    def pty():
        term = sb.open_pty(cols=80, rows=24)
        buf = bytearray()

        def read_until(marker: bytes):
            deadline = time.monotonic() + 30
            while marker not in buf:
                expect(time.monotonic() < deadline, f"pty never showed {marker!r}: {bytes(buf)!r}")
                chunk = term.read()
                expect(chunk != b"" or marker in buf, f"pty ended early: {bytes(buf)!r}")
                buf.extend(chunk)

        term.write(b"stty size\n")
        read_until(b"24 80")
        term.resize(100, 40)
        term.write(b"stty size\n")
        read_until(b"40 100")
        term.write(b"exit 0\n")
        while term.read():
            pass
        expect(term.exit_code == 0, f"pty exit {term.exit_code}")
        term.close()

    check("pty_with_resize", pty)

    def unsupported():
        raises(lambda: sb.git_status("/tmp"), "unimplemented")
        raises(lambda: sb.start_lsp("python"), "unimplemented")
        expect(sb.exec("true") == "", "the connection serves on after an unimplemented op")

    check("unsupported_ops_are_typed_unimplemented", unsupported)

    def ports():
        sb.mkdir("/tmp/www", parents=True)
        sb.write_file("/tmp/www/index.html", b"hello from the guest\n")
        server = sb.spawn("busybox", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/tmp/www")

        def fetch_over(port_conn):
            port_conn.send(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
            body = bytearray()
            while chunk := port_conn.recv():
                body.extend(chunk)
            port_conn.close()
            return bytes(body)

        def served():
            try:
                return b"hello from the guest" in fetch_over(sb.dial_port(8080))
            except SilkdError:
                return False

        eventually(served, "the guest server through dial_port")
        listener = sb.proxy_port("127.0.0.1:0", 8080)
        local = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", local), timeout=30) as sock:
            sock.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
            got = bytearray()
            while chunk := sock.recv(65536):
                got.extend(chunk)
        listener.close()
        expect(b"200 OK" in got and b"hello from the guest" in got, f"proxy_port {bytes(got)[:200]!r}")
        raises(lambda: sb.dial_port(8099), "not_found")
        # A preview URL: a plain HTTP client with the URL and nothing else.
        url = sb.preview_url(8080, ttl_seconds=600)
        with urllib.request.urlopen(url.rstrip("/") + "/index.html", timeout=60) as reply:
            expect(reply.status == 200 and b"hello from the guest" in reply.read(), f"preview {url}")
        parts = urllib.parse.urlsplit(url)
        wrong = parts._replace(path="/preview/" + "0" * 64 + "/index.html").geturl()
        try:
            urllib.request.urlopen(wrong, timeout=60)
            expect(False, "a preview URL with a wrong secret was served")
        except urllib.error.HTTPError as error:
            expect(error.code == 404, f"wrong secret answered {error.code}")
        sb.kill(server)

    check("dial_port_and_proxy_port", ports)

    def checkpoint():
        sb.write_file("/root/state.txt", b"before checkpoint")
        cp = sb.checkpoint("silkd-cp")
        expect(cp.name == "silkd-cp" and cp.sandbox_id == sb.id and cp.created_at, f"checkpoint {vars(cp)}")
        expect(any(c.id == cp.id for c in client.checkpoints()), "listed")
        child = cp.new(ttl_seconds=600)
        try:
            expect(child.read_file("/root/state.txt") == b"before checkpoint", "checkpoint state")
        finally:
            child.close()
        cp.delete()

    check("checkpoint_then_new", checkpoint)

    def fork():
        kids = sb.fork(1, ttl_seconds=600)
        expect(len(kids) == 1, f"children {kids}")
        try:
            expect(kids[0].read_file("/root/state.txt") == b"before checkpoint", "fork state")
            expect(kids[0].id != sb.id, "a new id")
        finally:
            kids[0].close()

    check("fork", fork)

    def hibernate():
        sb.hibernate()
        expect(sb.read_file("/root/state.txt") == b"before checkpoint", "state after wake")
        expect(sb.exec("echo", "awake") == "awake\n", "exec after wake")

    check("hibernate_then_transparent_wake", hibernate)

    def renew():
        deadline = sb.renew(900)
        expect(deadline and sb.deadline == deadline, f"renew {deadline!r}")

    check("renew", renew)

    def promote():
        tpl = sb.promote("silkd-tpl")
        expect(tpl.name == "silkd-tpl", f"template {tpl.name}")
        expect(tpl.content_digest.startswith("sha256:"), f"content digest {tpl.content_digest!r}")
        child = tpl.new(ttl_seconds=600)
        try:
            expect(child.read_file("/root/state.txt") == b"before checkpoint", "promoted state")
        finally:
            child.close()
        client.delete_template("silkd-tpl")

    check("promote_then_claim", promote)

    def close():
        sb.close()
        err = raises(lambda: sb.exec("true"), APIError)
        expect(err.status in (401, 404), f"after close {err.status}")

    check("close", close)

    print(f"{'FAILED ' + ', '.join(FAILURES) if FAILURES else 'all checks passed'}", flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
