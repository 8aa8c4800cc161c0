"""sandbox-mcp as a thin front end over a real node daemon (sandboxd), driven by the
official Python MCP SDK:

1. two MCP sessions at once, started with seed 000's `.mcp.json` arguments as
   written (`-addr 127.0.0.1:PORT -token T -template default`), share the node's
   warm pool and capacity and see only their own sandboxes; one cannot use the
   other's id;
2. a session that disconnects has its claims released on the node (the daemon's
   GET /v1/sandboxes shows them gone), and the other session, handed the ended
   session's id, is told it belonged to an ended session;
3. a wrong token is refused with a message that says which flag carries the
   operator's token;
4. the fleet and snapshot tools through the node, in one session: list_templates,
   create_sandboxes (2, and a count the node cannot hold refused with nothing
   claimed), ping_sandbox, fork, checkpoint, branch_checkpoint (the
   state carried into each), hibernate (ping does not wake it, exec does), promote
   (list_templates shows it; the operator deletes it), delete_checkpoint, and
   egress_log through the node (no records without egress), and expose_port: a
   busybox httpd in the sandbox fetched through the node's preview URL with a
   plain HTTP client (a wrong secret is a 404);
5. SANDSTORM_URL and SANDSTORM_TOKEN alone (no --profile) give sandstorm's tools
   over the same node: spawn_sandboxes, exec_command with the sandbox token,
   kill_sandbox (refused without the token, done with it).

Run by mcp/tests/python_node.rs, which passes:
  SANDBOX_MCP_BIN   the server binary
  SANDBOX_MCP_LOG   a file prefix for the servers' stderr
  NODE_ADDR         the daemon's HOST:PORT
  NODE_TOKEN        its operator token
  SANDBOX_HOME      a home of the test's own (the ended-session record lives there)
Prints `python-node: N checks passed` at the end; a failed check raises.
"""

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from contextlib import AsyncExitStack

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CHECKS = 0
ADDR = os.environ["NODE_ADDR"]
TOKEN = os.environ["NODE_TOKEN"]


def check(condition, what):
    global CHECKS
    if not condition:
        raise AssertionError(what)
    CHECKS += 1


def field(obj, snake, camel):
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def text_of(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


async def call_ok(session, tool, args):
    result = await session.call_tool(tool, args)
    check(not field(result, "is_error", "isError"), f"{tool} failed: {text_of(result)}")
    data = field(result, "structured_content", "structuredContent")
    check(isinstance(data, dict), f"{tool} returned no structured content: {result}")
    return data


async def call_err(session, tool, args):
    result = await session.call_tool(tool, args)
    check(field(result, "is_error", "isError"), f"{tool} should fail: {text_of(result)}")
    return text_of(result)


def node_sandboxes():
    """The daemon's own view (operator token): the ids of every live sandbox."""
    request = urllib.request.Request(
        f"http://{ADDR}/v1/sandboxes", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return {row["id"] for row in json.load(answer)["sandboxes"]}


def fetch(url, within=30):
    """GET url with no proxy and no token, retrying while the guest server starts:
    (status, body)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + within
    while True:
        try:
            with opener.open(url, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            if error.code != 502 or time.monotonic() > deadline:
                return error.code, error.read().decode()
        time.sleep(0.5)


def wait_for_warm(within=300):
    """Until the node's pool has its warm VM (a boot under TCG on a busy host)."""
    deadline = time.monotonic() + within
    while True:
        request = urllib.request.Request(
            f"http://{ADDR}/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            pool = json.load(answer).get("pool") or {}
        if pool.get("warm", 0) >= 1:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no warm VM within {within} s: {pool}")
        time.sleep(0.5)


def delete_template(name):
    """The operator removes a promoted template (no MCP tool does)."""
    request = urllib.request.Request(
        f"http://{ADDR}/v1/templates?template={name}",
        method="DELETE",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.load(answer)


def env(extra):
    """Only what the test gives: no SANDBOXD_* or SANDSTORM_* from the shell."""
    base = {"SANDBOX_HOME": os.environ["SANDBOX_HOME"], "RUST_LOG": "info,rmcp=warn"}
    base.update(extra)
    return base


async def open_session(stack, name, args, extra_env=None):
    params = StdioServerParameters(
        command=os.environ["SANDBOX_MCP_BIN"], args=args, env=env(extra_env or {})
    )
    errlog = stack.enter_context(open(f"{os.environ['SANDBOX_MCP_LOG']}.{name}", "w"))
    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


SEED_000 = ["-addr", ADDR, "-token", TOKEN, "-template", "default"]


async def two_sessions():
    async with AsyncExitStack() as b_stack:
        b = await open_session(b_stack, "b", SEED_000)
        async with AsyncExitStack() as a_stack:
            a = await open_session(a_stack, "a", SEED_000)
            claim_a, claim_b = await asyncio.gather(
                call_ok(a, "create_sandbox", {}), call_ok(b, "create_sandbox", {})
            )
            id_a, id_b = claim_a["sandbox_id"], claim_b["sandbox_id"]
            check(id_a != id_b, f"two claims, one id: {id_a}")
            warm = [claim_a["warm"], claim_b["warm"]]
            check(True in warm, f"neither claim took the node's warm VM: {warm}")
            print(f"claims: a={id_a} b={id_b} warm={warm}")
            check({id_a, id_b} <= node_sandboxes(), "the node holds both")

            listed_a = await call_ok(a, "list_sandboxes", {})
            listed_b = await call_ok(b, "list_sandboxes", {})
            check([row["sandbox_id"] for row in listed_a["sandboxes"]] == [id_a], f"a sees {listed_a}")
            check([row["sandbox_id"] for row in listed_b["sandboxes"]] == [id_b], f"b sees {listed_b}")
            info = await call_ok(a, "node_info", {})
            check([c["sandbox_id"] for c in info["claims"]] == [id_a], f"a's node_info claims: {info}")
            check(info["capacity"]["max_sandboxes"] == 4, f"the node's capacity: {info}")

            ran = await call_ok(a, "exec", {"sandbox_id": id_a, "command": "echo hi from $(hostname)"})
            check(ran["exit_code"] == 0 and "hi from" in ran["stdout"], f"exec: {ran}")
            await call_ok(b, "write_file", {"sandbox_id": id_b, "path": "/tmp/x", "content": "node"})
            read = await call_ok(b, "read_file", {"sandbox_id": id_b, "path": "/tmp/x"})
            check(read["content"] == "node", f"read_file: {read}")
            refused = await call_err(b, "exec", {"sandbox_id": id_a, "command": "true"})
            check("Unknown sandbox_id" in refused, f"b used a's sandbox: {refused}")
            print("each session sees and reaches only its own")
        # a disconnected: its claim is released on the node.
        for _ in range(100):
            if id_a not in node_sandboxes():
                break
            await asyncio.sleep(0.1)
        live = node_sandboxes()
        check(id_a not in live and id_b in live, f"after a disconnected the node holds {live}")
        ended = await call_err(b, "exec", {"sandbox_id": id_a, "command": "true"})
        check("belonged to an MCP session that has ended" in ended, f"a's id in b: {ended}")
        print("a's claim was released at its disconnect; b is told so")
    for _ in range(100):
        if id_b not in node_sandboxes():
            break
        await asyncio.sleep(0.1)
    check(id_b not in node_sandboxes(), "b's claim was released at its disconnect")


async def release_all(session, ids):
    for sandbox_id in ids:
        done = await call_ok(session, "release", {"sandbox_id": sandbox_id})
        check(done["sandbox_id"] == sandbox_id, f"release: {done}")
    live = node_sandboxes()
    check(not set(ids) & live, f"released, yet the node holds {set(ids) & live}")


async def cat_state(session, sandbox_id, want, what):
    ran = await call_ok(session, "exec", {"sandbox_id": sandbox_id, "command": "cat /tmp/state"})
    check(ran["exit_code"] == 0 and ran["stdout"].strip() == want, f"{what}: {ran}")


async def fleet_and_snapshots():
    """At most four VMs at once: the warm one (refilled) and three claims."""
    async with AsyncExitStack() as stack:
        c = await open_session(stack, "c", SEED_000)
        templates = (await call_ok(c, "list_templates", {}))["templates"]
        names = [row["name"] for row in templates]
        check("default" in names, f"list_templates: {names}")
        default = next(row for row in templates if row["name"] == "default")
        check(default["default"] and not default["promoted"] and default["error"] is None, f"default: {default}")
        check([row["name"] for row in templates if row["default"]] == ["default"], f"defaults: {templates}")

        before = node_sandboxes()
        too_many = await call_err(c, "create_sandboxes", {"count": 9})
        check("between 1 and 4" in too_many, f"count 9: {too_many}")
        check(node_sandboxes() == before, "a refused batch claimed nothing")
        batch = await call_ok(c, "create_sandboxes", {"count": 2, "ttl_seconds": 900})
        ids = [row["sandbox_id"] for row in batch["sandboxes"]]
        check(len(set(ids)) == 2 and set(ids) <= node_sandboxes(), f"create_sandboxes: {batch}")
        check(all(row["template"] == "default" and row["ttl_seconds"] == 900 for row in batch["sandboxes"]), f"rows: {batch}")
        check(batch["warm"] == sum(row["warm"] for row in batch["sandboxes"]), f"warm count: {batch}")
        listed = {row["sandbox_id"] for row in (await call_ok(c, "list_sandboxes", {}))["sandboxes"]}
        check(listed == set(ids), f"list_sandboxes after the batch: {listed}")
        first, second = ids
        print(f"create_sandboxes made {ids} ({batch['warm']} warm) in {batch['batch_ms']} ms")

        ping = await call_ok(c, "ping_sandbox", {"sandbox_id": first})
        check(ping["state"] == "running" and ping["round_trip_ms"] is not None, f"ping: {ping}")
        check(bool(ping["agent_version"]) and ping["mem_total_bytes"] > 0, f"ping's report: {ping}")
        egress = await call_ok(c, "egress_log", {"sandbox_id": first})
        check(egress["sandbox_id"] == first and egress["records"] == [], f"egress_log: {egress}")
        await call_ok(c, "exec", {
            "sandbox_id": first,
            "command": "mkdir -p /tmp/www && echo exposed-page > /tmp/www/index.html && "
                       "(httpd -p 127.0.0.1:8000 -h /tmp/www >/dev/null 2>&1 &) && "
                       # httpd binds after the shell returns: wait until it answers.
                       "i=0 && until wget -q -O /dev/null http://127.0.0.1:8000/; do "
                       "i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done",
        })
        exposed = await call_ok(c, "expose_port", {"sandbox_id": first, "port": 8000})
        check(exposed["kind"] == "preview" and exposed["port"] == 8000, f"expose_port: {exposed}")
        check(exposed["url"].startswith(f"http://{ADDR}/preview/"), f"expose_port's url: {exposed}")
        status, page = await asyncio.to_thread(fetch, exposed["url"])
        check(status == 200 and "exposed-page" in page, f"the preview page: {status} {page}")
        status, _ = await asyncio.to_thread(fetch, f"http://{ADDR}/preview/{'0' * 64}/", 0)
        check(status == 404, f"a wrong preview secret: {status}")
        print(f"expose_port: {exposed['url']} serves the guest's httpd")
        await release_all(c, [second])

        await call_ok(c, "exec", {"sandbox_id": first, "command": "echo parent-state > /tmp/state"})
        forked = await call_ok(c, "fork", {"sandbox_id": first, "count": 1})
        children = [row["sandbox_id"] for row in forked["children"]]
        check(len(children) == 1 and forked["sandbox_id"] == first, f"fork: {forked}")
        await cat_state(c, children[0], "parent-state", "the fork's child")
        row = await call_ok(c, "get_sandbox", {"sandbox_id": children[0]})
        check(row["forked_from"] == first, f"the child's row: {row}")
        await release_all(c, children)
        print(f"fork: {children[0]} carries {first}'s files")

        taken = await call_ok(c, "checkpoint", {"sandbox_id": first, "name": "node-ckpt"})
        check(taken["sandbox_id"] == first and taken["name"] == "node-ckpt", f"checkpoint: {taken}")
        listed = (await call_ok(c, "list_checkpoints", {}))["checkpoints"]
        check(any(row["checkpoint_id"] == taken["checkpoint_id"] for row in listed), f"list_checkpoints: {listed}")
        await call_ok(c, "exec", {"sandbox_id": first, "command": "echo after > /tmp/state"})
        branched = await call_ok(c, "branch_checkpoint", {"checkpoint_id": "node-ckpt"})
        branch = branched["sandbox_id"]
        check(branched["checkpoint_id"] == taken["checkpoint_id"], f"branch_checkpoint: {branched}")
        await cat_state(c, branch, "parent-state", "the branch (the checkpoint's state, not later)")
        await release_all(c, [first])
        print(f"checkpoint {taken['checkpoint_id']} branched into {branch}")

        slept = await call_ok(c, "hibernate", {"sandbox_id": branch})
        check(slept["sandbox_id"] == branch and slept["hibernated_now"], f"hibernate: {slept}")
        ping = await call_ok(c, "ping_sandbox", {"sandbox_id": branch})
        check(ping["state"] == "hibernated" and ping["round_trip_ms"] is None, f"ping asleep: {ping}")
        row = await call_ok(c, "get_sandbox", {"sandbox_id": branch})
        check(row["state"] == "hibernated", f"the ping woke it: {row}")
        await cat_state(c, branch, "parent-state", "exec on a hibernated sandbox")
        row = await call_ok(c, "get_sandbox", {"sandbox_id": branch})
        check(row["state"] == "running", f"exec did not wake it: {row}")
        print(f"hibernate: {branch} slept through a ping and woke for exec")

        name = f"mcp-node-promoted-{os.getpid()}"
        promoted = await call_ok(c, "promote", {"sandbox_id": branch, "template": name})
        check(promoted["template"] == name and promoted["sandbox_id"] == branch, f"promote: {promoted}")
        try:
            templates = (await call_ok(c, "list_templates", {}))["templates"]
            row = next((row for row in templates if row["name"] == name), None)
            check(row is not None and row["promoted"] and not row["default"], f"promoted row: {templates}")
        finally:
            deleted = delete_template(name)
        check(deleted["template"] == name, f"template delete: {deleted}")
        names = [row["name"] for row in (await call_ok(c, "list_templates", {}))["templates"]]
        check(name not in names, f"deleted, yet listed: {names}")
        print(f"promote: {name} listed as promoted, then deleted by the operator")

        await release_all(c, [branch])
        gone = await call_ok(c, "delete_checkpoint", {"checkpoint_id": "node-ckpt"})
        check(gone["checkpoint_id"] == taken["checkpoint_id"] and gone["freed_bytes"] > 0, f"delete_checkpoint: {gone}")
        listed = (await call_ok(c, "list_checkpoints", {}))["checkpoints"]
        check(not listed, f"checkpoints left: {listed}")


async def wrong_token():
    async with AsyncExitStack() as stack:
        session = await open_session(stack, "bad", ["-addr", ADDR, "-token", "not-the-token"])
        refused = await call_err(session, "create_sandbox", {})
        check("refused this server's token" in refused and "--token" in refused, refused)
        print("a wrong token is refused: " + refused.split(".")[0])


async def sandstorm():
    async with AsyncExitStack() as stack:
        session = await open_session(
            stack, "sandstorm", [], {"SANDSTORM_URL": f"http://{ADDR}", "SANDSTORM_TOKEN": TOKEN}
        )
        tools = {tool.name for tool in (await session.list_tools()).tools}
        check("spawn_sandboxes" in tools and "create_sandbox" not in tools, f"tools: {sorted(tools)}")
        spawned = await call_ok(session, "spawn_sandboxes", {"snapshot_tag": "default", "n": 1})
        box = spawned["result"][0]
        check(box["id"] in node_sandboxes(), f"spawned on the node: {box}")
        ran = await call_ok(
            session,
            "exec_command",
            {"sandbox_id": box["id"], "args": ["echo", "storm"], "sandbox_token": box["token"]},
        )
        check(ran["stdout"].strip() == "storm", f"exec_command: {ran}")
        wrong = await call_err(
            session,
            "exec_command",
            {"sandbox_id": box["id"], "args": ["true"], "sandbox_token": "x" * len(box["token"])},
        )
        check("sandbox_token" in wrong, wrong)
        unkilled = await call_err(session, "kill_sandbox", {"sandbox_id": box["id"]})
        check("sandbox_token is required" in unkilled, f"kill_sandbox without a token: {unkilled}")
        check(box["id"] in node_sandboxes(), "kill_sandbox without a token killed it")
        killed = await call_ok(
            session, "kill_sandbox", {"sandbox_id": box["id"], "sandbox_token": box["token"]}
        )
        check(killed["killed"], f"kill_sandbox: {killed}")
        check(box["id"] not in node_sandboxes(), "kill_sandbox released it on the node")
        print("the sandstorm profile through SANDSTORM_URL works on the node")


async def main():
    wait_for_warm()
    await two_sessions()
    await fleet_and_snapshots()
    await wrong_token()
    await sandstorm()
    check(node_sandboxes() == set(), f"the node still holds {node_sandboxes()}")
    print(f"python-node: {CHECKS} checks passed")


asyncio.run(main())
