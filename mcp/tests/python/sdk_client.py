"""sandbox-mcp driven by the official Python MCP SDK (the `mcp` package), the way a
Python agent framework would: the SDK starts the server over stdio, initializes,
lists the tools, creates a microVM sandbox, runs exec (a shell string and an argv),
writes and reads a text file and a binary one (base64, checked by SHA-256), sees a
failing command and an unknown sandbox come back as results, gets progress
notifications during a long exec, and releases the sandbox. The SDK itself checks
each structuredContent against the tool's outputSchema.

Run by mcp/tests/python_sdk.rs, which passes:
  SANDBOX_MCP_BIN      the server binary to start
  SANDBOX_MCP_LOG      where the server's stderr goes
  SANDBOX_*            the launcher's variables (run folder, home), passed to the server
Prints one line per step, and `python-sdk: N checks passed` at the end; any failed
check raises (exit status 1 with the traceback).
"""

import asyncio
import base64
import hashlib
import importlib.metadata
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CHECKS = 0


def check(condition, what):
    """One assertion, counted; `what` is shown when it fails."""
    global CHECKS
    if not condition:
        raise AssertionError(what)
    CHECKS += 1


def field(obj, snake, camel):
    """A result field under the SDK's 2.x (snake_case) or 1.x (camelCase) name."""
    if hasattr(obj, snake):
        return getattr(obj, snake)
    return getattr(obj, camel)


def text_of(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


def structured(result, tool):
    """The structured content of a successful call."""
    check(not field(result, "is_error", "isError"), f"{tool} failed: {text_of(result)}")
    check(text_of(result) != "", f"{tool} has no text rendering")
    data = field(result, "structured_content", "structuredContent")
    check(isinstance(data, dict), f"{tool} returned no structured content: {result}")
    return data


async def call_ok(session, tool, args, **kwargs):
    return structured(await session.call_tool(tool, args, **kwargs), tool)


def server_env():
    """The launcher's variables of this process (the SDK gives the server only a
    minimal environment of its own: HOME, PATH and a few more)."""
    env = {name: value for name, value in os.environ.items() if name.startswith("SANDBOX_")}
    for own in ("SANDBOX_MCP_BIN", "SANDBOX_MCP_LOG"):
        env.pop(own, None)
    env["RUST_LOG"] = os.environ.get("RUST_LOG", "info,rmcp=warn")
    return env


async def main():
    binary = os.environ["SANDBOX_MCP_BIN"]
    print(f"python-sdk: mcp {importlib.metadata.version('mcp')}, Python {sys.version.split()[0]}")
    params = StdioServerParameters(
        command=binary,
        args=["--pool", "0", "--max-sandboxes", "1"],
        env=server_env(),
    )
    with open(os.environ["SANDBOX_MCP_LOG"], "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await drive(session)
    print(f"python-sdk: {CHECKS} checks passed")


async def drive(session):
    init = await session.initialize()
    server_info = field(init, "server_info", "serverInfo")
    check(server_info.name == "sandbox-mcp", f"server name: {server_info}")
    print(f"initialized: {server_info.name} {server_info.version}")

    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    for name in ("create_sandbox", "exec", "write_file", "read_file", "release", "fork"):
        check(name in tools, f"no {name} tool in {sorted(tools)}")
    for tool in tools.values():
        schema = field(tool, "input_schema", "inputSchema")
        check(schema.get("type") == "object", f"{tool.name}'s input schema: {schema}")
        check(tool.annotations is not None, f"{tool.name} has no annotations")
    exec_props = field(tools["exec"], "input_schema", "inputSchema")["properties"]
    check("command" in exec_props and "argv" in exec_props, f"exec arguments: {exec_props}")
    check(
        field(tools["exec"], "output_schema", "outputSchema") is not None,
        "exec has no output schema",
    )
    print(f"tools: {len(tools)}")

    claim = await call_ok(session, "create_sandbox", {})
    sandbox = claim["sandbox_id"]
    check(sandbox.startswith("sbx-"), f"sandbox id: {claim}")
    check(claim["ttl_seconds"] > 0, f"ttl: {claim}")
    print(f"created {sandbox} ({claim['origin']}, {claim['claim_ms']} ms)")

    ran = await call_ok(session, "exec", {"sandbox_id": sandbox, "command": "uname -s; echo $((6*7))"})
    check(ran["exit_code"] == 0, f"exec: {ran}")
    check(ran["stdout"] == "Linux\n42\n", f"exec stdout: {ran}")
    check(ran["truncated"] is False, f"exec: {ran}")
    argv = await call_ok(session, "exec", {"sandbox_id": sandbox, "argv": ["printf", "%s|", "a b", "$HOME"]})
    check(argv["stdout"] == "a b|$HOME|", f"argv reached a shell: {argv}")
    failed = await call_ok(session, "exec", {"sandbox_id": sandbox, "command": "echo oops >&2; exit 3"})
    check(failed["exit_code"] == 3 and failed["stderr"] == "oops\n", f"failing exec: {failed}")
    print("exec: shell string, argv, failing command")

    text = "héllo from the Python SDK\n" * 100
    wrote = await call_ok(session, "write_file", {"sandbox_id": sandbox, "path": "/tmp/py-hello.txt", "content": text})
    check(wrote["bytes"] == len(text.encode()), f"write_file: {wrote}")
    read = await call_ok(session, "read_file", {"sandbox_id": sandbox, "path": "/tmp/py-hello.txt"})
    check(read["content"] == text, f"read_file text: {read['content'][:80]!r}")
    check(read["size"] == len(text.encode()), f"read_file size: {read}")

    blob = bytes((i * 7919 + (i >> 8)) % 256 for i in range(300_000))
    digest = hashlib.sha256(blob).hexdigest()
    await call_ok(
        session,
        "write_file",
        {"sandbox_id": sandbox, "path": "/tmp/py-blob.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"},
    )
    summed = await call_ok(session, "exec", {"sandbox_id": sandbox, "argv": ["sha256sum", "/tmp/py-blob.bin"]})
    check(summed["stdout"].startswith(digest), f"guest checksum: {summed}")
    back = bytearray()
    offset = 0
    while True:
        part = await call_ok(
            session,
            "read_file",
            {"sandbox_id": sandbox, "path": "/tmp/py-blob.bin", "encoding": "base64", "offset": offset},
        )
        check(part["encoding"] == "base64", f"read_file encoding: {part['encoding']}")
        back += base64.b64decode(part["content"])
        if part.get("next_offset") is None:
            break
        offset = part["next_offset"]
    check(hashlib.sha256(back).hexdigest() == digest, "the binary file came back changed")
    print(f"files: text and {len(blob)} binary bytes, sha256 {digest[:12]}")

    unknown = await session.call_tool("exec", {"sandbox_id": "sbx-nope", "command": "true"})
    check(field(unknown, "is_error", "isError") is True, f"unknown sandbox: {unknown}")
    check("Unknown sandbox_id" in text_of(unknown), f"unknown sandbox: {text_of(unknown)}")

    progress = []

    async def on_progress(value, total, message):
        progress.append((value, message))

    slow = await call_ok(
        session,
        "exec",
        {"sandbox_id": sandbox, "command": "for i in 1 2 3; do echo tick $i; sleep 1; done"},
        progress_callback=on_progress,
    )
    check(slow["stdout"] == "tick 1\ntick 2\ntick 3\n", f"slow exec: {slow}")
    check(len(progress) >= 1, "no progress notification during a 3 s exec")
    check(any("tick" in (message or "") for _, message in progress), f"progress messages: {progress}")
    print(f"progress: {len(progress)} notifications during a 3 s exec")

    released = await call_ok(session, "release", {"sandbox_id": sandbox})
    check(released["sandbox_id"] == sandbox, f"release: {released}")
    gone = await session.call_tool("exec", {"sandbox_id": sandbox, "command": "true"})
    check(field(gone, "is_error", "isError") is True, "a released sandbox still runs commands")
    print("released")


if __name__ == "__main__":
    asyncio.run(main())
