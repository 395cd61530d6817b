"""Models loaded and unloaded while serving (the admin API, `infinity-cloud models`): its own
keys, load and unload under steady traffic with no failure but the documented 503s, what was
admitted finishing before a model is freed, and the refusals (409, 413)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import FAKE, fake, serve_in_process, server_process, spec_of

from infinity_cloud import Engine
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.engine.asks import EmbedAsk

ADMIN = {"Authorization": "Bearer admin-secret"}


def embedder(path: Path) -> ModelSpec:
    return ModelSpec(model_id=str(path), served_model_name="embedder", backend="torch")


async def test_no_admin_api_without_admin_keys_and_each_key_opens_only_its_own(tiny_embedder: Path) -> None:
    async with serve_in_process(spec_of(embedder(tiny_embedder))) as client:
        assert (await client.get("/admin/models", headers=ADMIN)).status_code == 404
    spec = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"], api_keys=["api-secret"])
    async with serve_in_process(spec, headers={}) as client:
        assert (await client.get("/admin/models")).status_code == 401
        api = {"Authorization": "Bearer api-secret"}
        refused = await client.get("/admin/models", headers=api)
        assert refused.status_code == 401 and "invalid admin key" in refused.text
        listed = await client.get("/admin/models", headers=ADMIN)
        assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == ["embedder"]
        body = {"model": "embedder", "input": ["x"]}
        assert (await client.post("/v1/embeddings", json=body, headers=ADMIN)).status_code == 401
        assert (await client.post("/v1/embeddings", json=body, headers=api)).status_code == 200


async def traffic(client: httpx.AsyncClient, route: str, body: dict[str, Any], stop: asyncio.Event,
                  statuses: list[int]) -> None:
    """Requests one after another until `stop`, each status kept; a 503 must say when to retry."""
    while not stop.is_set():
        response = await client.post(route, json=body)
        statuses.append(response.status_code)
        if response.status_code == 503:
            assert response.headers.get("Retry-After"), response.text
        await asyncio.sleep(0.005)


async def test_load_and_unload_under_steady_traffic(tiny_embedder: Path, tiny_reranker: Path) -> None:
    spec = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                   admin_model_roots=[tiny_reranker.parent])
    async with serve_in_process(spec) as client:
        stop = asyncio.Event()
        embeds: list[int] = []
        reranks: list[int] = []
        rerank = {"model": "reranker", "query": "q", "documents": ["a", "b"]}
        embed = {"model": "embedder", "input": ["x"]}
        steady = asyncio.ensure_future(traffic(client, "/v1/embeddings", embed, stop, embeds))
        loaded = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_reranker), "served_model_name": "reranker", "backend": "torch"})
        assert loaded.status_code == 202 and loaded.json()["state"] == "loading", loaded.text
        asked = asyncio.ensure_future(traffic(client, "/rerank", rerank, stop, reranks))
        for _ in range(600):
            listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
            states = {m["id"]: m["state"] for m in listed}
            if states["reranker"] != "loading":
                break
            await asyncio.sleep(0.05)
        assert states == {"embedder": "ready", "reranker": "ready"}
        assert (await client.get("/health")).status_code == 200
        await asyncio.sleep(0.3)  # served for a while
        unloaded = await client.delete("/admin/models/reranker", headers=ADMIN)
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.json()["id"] == "reranker" and unloaded.json()["freed_bytes"] >= 0
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(steady, asked)
        gone = await client.post("/rerank", json=rerank)
        assert gone.status_code == 404 and "was unloaded" in gone.text
        listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
    assert set(embeds) == {200} and len(embeds) > 10, "the model already served never failed"
    assert 200 in reranks and set(reranks) <= {200, 503, 404}, sorted(set(reranks))
    first_ok = reranks.index(200)
    assert set(reranks[:first_ok]) <= {503}, "before it was ready: 503 with Retry-After, nothing else"
    assert [m["id"] for m in listed] == ["embedder"]


async def test_what_was_admitted_finishes_before_the_model_is_freed(tiny_embedder: Path) -> None:
    slow = fake(tiny_embedder, "slow", backend_options={"delay_s": 0.4})
    spec = spec_of(embedder(tiny_embedder), slow, admin_keys=["admin-secret"])
    async with serve_in_process(spec) as client:
        body = {"model": "slow", "input": ["one", "two"]}
        in_flight = asyncio.ensure_future(client.post("/v1/embeddings", json=body))
        await asyncio.sleep(0.1)  # admitted, in its batch
        unloading = asyncio.ensure_future(client.delete("/admin/models/slow", headers=ADMIN))
        await asyncio.sleep(0.05)
        refused = await client.post("/v1/embeddings", json=body)
        answered, unloaded = await asyncio.gather(in_flight, unloading)
    assert answered.status_code == 200 and len(answered.json()["data"]) == 2, answered.text
    assert refused.status_code == 503 and "being unloaded" in refused.text and refused.headers["Retry-After"]
    assert unloaded.status_code == 200 and unloaded.json()["drained"] == 1, unloaded.text


async def test_readiness_is_503_while_the_only_model_is_swapped(tiny_embedder: Path) -> None:
    """A replica whose only model is being unloaded, or whose replacement still loads, serves
    nothing: /health (the Kubernetes readiness probe) is 503 until a model is ready again."""
    slow = fake(tiny_embedder, "only", backend_options={"delay_s": 0.4})
    spec = spec_of(slow, admin_keys=["admin-secret"], admin_model_roots=[tiny_embedder.parent])
    async with serve_in_process(spec) as client:
        assert (await client.get("/health")).status_code == 200
        body = {"model": "only", "input": ["x"]}
        in_flight = asyncio.ensure_future(client.post("/v1/embeddings", json=body))
        await asyncio.sleep(0.1)
        unloading = asyncio.ensure_future(client.delete("/admin/models/only", headers=ADMIN))
        await asyncio.sleep(0.05)
        draining = await client.get("/health")
        assert draining.status_code == 503 and draining.headers["Retry-After"], draining.text
        assert (await in_flight).status_code == 200 and (await unloading).status_code == 200
        empty = await client.get("/health")
        assert empty.status_code == 503 and "no model is loaded" in empty.text, empty.text
        loaded = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_embedder), "served_model_name": "next", "backend": "torch"})
        assert loaded.status_code == 202, loaded.text
        seen = []
        for _ in range(600):
            seen.append((await client.get("/health")).status_code)
            if seen[-1] == 200:
                break
            await asyncio.sleep(0.05)
    assert seen[-1] == 200 and set(seen[:-1]) <= {503}, seen


async def test_a_taken_name_is_409_and_a_model_past_the_budget_413(
    tiny_embedder: Path, tiny_reranker: Path, tmp_path: Path
) -> None:
    spec = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                   admin_model_roots=[tiny_reranker.parent, tmp_path])
    async with serve_in_process(spec) as client:
        taken = await client.post("/admin/models", headers=ADMIN,
                                  json={"model_id": str(tiny_reranker), "served_model_name": "embedder"})
        assert taken.status_code == 409 and "already served" in taken.text
        bad = await client.post("/admin/models", headers=ADMIN,
                                json={"model_id": str(tiny_reranker), "dtype": "f8"})
        assert bad.status_code == 400 and "dtype" in bad.text
        missing = await client.delete("/admin/models/nothing", headers=ADMIN)
        assert missing.status_code == 404
        nowhere = await client.post("/admin/models", headers=ADMIN, json={"model_id": str(tmp_path / "none")})
        assert nowhere.status_code == 400 and "does not exist" in nowhere.text, nowhere.text
        unserved = tmp_path / "unserved"
        unserved.mkdir()
        (unserved / "config.json").write_text('{"model_type": "llava", "vision_config": {}}',
                                              encoding="utf-8")
        refused = await client.post("/admin/models", headers=ADMIN, json={"model_id": str(unserved)})
        assert refused.status_code == 400 and "image and audio models served" in refused.text, refused.text
        listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
        assert [m["id"] for m in listed] == ["embedder"], "nothing refused was added"
    tight = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"], limits={"memory_budget_mb": 64},
                    admin_model_roots=[tiny_reranker.parent])
    async with serve_in_process(tight) as client:  # this process alone holds more than 64 MB
        refused = await client.post("/admin/models", headers=ADMIN,
                                    json={"model_id": str(tiny_reranker), "served_model_name": "reranker"})
        assert refused.status_code == 413 and "--memory-budget-mb" in refused.text, refused.text


async def test_a_control_character_in_an_id_is_a_400_naming_the_field(tiny_embedder: Path) -> None:
    """A NUL byte in a model id or revision would reach the file system as a path (a 500:
    'embedded null byte'); a name with one is looked up, never opened."""
    spec = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                   admin_model_roots=[tiny_embedder.parent])
    async with serve_in_process(spec) as client:
        for body in ({"model_id": "a\x00b"}, {"model_id": f"{tiny_embedder}\x00"},
                     {"model_id": "/etc/passwd\x00"}, {"model_id": "org/model\n"},
                     {"model_id": str(tiny_embedder), "revision": "main\x00"}):
            refused = await client.post("/admin/models", headers=ADMIN, json=body)
            field = "revision" if "revision" in body else "model_id"
            assert refused.status_code == 400, (body, refused.status_code, refused.text)
            assert field in refused.text and "control character" in refused.text, refused.text
        for method, path in (("DELETE", "/admin/models/a%00b"), ("GET", "/models/a%00b"),
                             ("GET", "/v1/models/a%00b")):
            missing = await client.request(method, path, headers=ADMIN if method == "DELETE" else {})
            assert missing.status_code == 404, (path, missing.status_code, missing.text)
        listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
        assert [m["id"] for m in listed] == ["embedder"]


def test_the_models_command_loads_lists_and_unloads(tiny_embedder: Path, tiny_reranker: Path,
                                                     tmp_path: Path) -> None:
    keys = tmp_path / "admin-keys"
    keys.write_text("# the admin's\nadmin-secret\n", encoding="utf-8")
    env = {**os.environ, "INFINITY_CLOUD_ADMIN_KEY": "admin-secret", "HF_HUB_OFFLINE": "1"}

    def models(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "infinity_cloud", "models", *args], env=env,
                              capture_output=True, text=True, encoding="utf-8", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    with server_process("--model-id", str(tiny_embedder), "--served-model-name", "embedder",
                        "--admin-key-file", str(keys),
                        "--admin-model-root", str(tiny_reranker.parent)) as url:
        assert "reranker: ready" in models("load", str(tiny_reranker), "--url", url,
                                           "--served-model-name", "reranker", "--backend", "torch")
        listed = models("list", "--url", url)
        assert "embedder" in listed and "reranker" in listed and "ready" in listed
        answer = httpx.post(f"{url}/rerank", json={"model": "reranker", "query": "q", "documents": ["a"]})
        assert answer.status_code == 200, answer.text
        assert "reranker: unloaded" in models("unload", "reranker", "--url", url)
        assert "reranker" not in models("list", "--url", url)
    refused = subprocess.run(
        [sys.executable, "-m", "infinity_cloud", "models", "list", "--url", "http://127.0.0.1:9"],
        env=env, capture_output=True, text=True, encoding="utf-8", timeout=60,
    )
    assert refused.returncode == 2 and "cannot reach" in refused.stderr


async def test_paths_outside_the_model_roots_get_one_answer_and_remote_code_needs_the_servers_leave(
    tiny_embedder: Path, tiny_reranker: Path
) -> None:
    """A local folder is loaded only from under --admin-model-root: any other path, whether
    it exists, is a folder or a file, is refused with the same words (an error must not map
    the machine). trust_remote_code runs the folder's Python in the server: refused unless the
    server was started with --admin-trust-remote-code. A model_id past any path's length and
    a name no URL can carry are 400s, not 500s."""
    spec = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                   admin_model_roots=[tiny_reranker.parent])
    async with serve_in_process(spec) as client:
        answers = []
        for path in ("/root/.ssh", "/proc/self", "/etc/passwd", "/no/such/folder", f"{tiny_reranker}/../..",
                     "../../etc"):
            refused = await client.post("/admin/models", headers=ADMIN, json={"model_id": path})
            assert refused.status_code == 400, refused.text
            answers.append(refused.json()["error"]["message"].replace(repr(path), "PATH"))
        assert len(set(answers)) == 1 and "not under a folder the admin API loads models from" in answers[0]
        remote = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_reranker), "served_model_name": "remote", "trust_remote_code": True})
        assert remote.status_code == 400 and "--admin-trust-remote-code" in remote.text, remote.text
        long = await client.post("/admin/models", headers=ADMIN, json={"model_id": "a" * 5000})
        assert long.status_code == 400 and "model_id" in long.text, long.text
        unaddressable = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_reranker), "served_model_name": "../x"})
        assert unaddressable.status_code == 400 and "cannot be addressed" in unaddressable.text
        listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
        assert [m["id"] for m in listed] == ["embedder"], "nothing refused was added"
    trusting = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                       admin_model_roots=[tiny_reranker.parent], admin_trust_remote_code=True)
    async with serve_in_process(trusting) as client:
        remote = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_reranker), "served_model_name": "remote", "trust_remote_code": True,
            "backend": "torch"})
        assert remote.status_code == 202, remote.text


async def test_a_second_default_a_second_delete_and_a_load_that_leaves_no_room_are_refused(
    tiny_embedder: Path, tiny_reranker: Path
) -> None:
    """A load marked default while another default is served is a 409 (it would silently take
    requests that name no model); two DELETEs of one model: the second is a 409, not a 500;
    and a load whose measured cost leaves the memory budget no room for requests is unloaded
    again with the numbers, while the model served before still answers."""
    first = embedder(tiny_embedder).model_copy(update={"default": True})
    spec = spec_of(first, fake(tiny_embedder, "slow", backend_options={"delay_s": 0.3}),
                   admin_keys=["admin-secret"], admin_model_roots=[tiny_reranker.parent])
    async with serve_in_process(spec) as client:
        second = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_embedder), "served_model_name": "other", "default": True})
        assert second.status_code == 409 and "'embedder' is the default" in second.text, second.text
        busy = asyncio.ensure_future(client.post("/v1/embeddings", json={"model": "slow", "input": ["x"]}))
        await asyncio.sleep(0.05)
        deletes = await asyncio.gather(client.delete("/admin/models/slow", headers=ADMIN),
                                       client.delete("/admin/models/slow", headers=ADMIN))
        assert sorted(d.status_code for d in deletes) == [200, 409], [d.text for d in deletes]
        assert (await busy).status_code == 200
    from infinity_cloud.admission.memory import MB, MemoryBudget
    from infinity_cloud.engine import Engine

    # The process as the budget sees it: 400 MB idle, and 250 MB more while the reranker is
    # loaded (what MiniLM's load was measured to add, where its weights said 86 MB).
    engine = Engine(spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                            admin_model_roots=[tiny_reranker.parent]))

    def resident() -> int:
        loaded = engine.models.get("reranker")
        return (400 + (250 if loaded is not None and loaded.towers else 0)) * MB  # its weights are in

    async with serve_in_process(engine) as client:
        engine.memory = MemoryBudget(700 * MB, resident=resident)
        body = {"model": "embedder", "input": ["before the load"] * 8}
        assert (await client.post("/v1/embeddings", json=body)).status_code == 200
        loaded = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_reranker), "served_model_name": "reranker", "backend": "torch"})
        assert loaded.status_code == 202, loaded.text
        for _ in range(600):
            state = {m["id"]: m for m in (await client.get("/admin/models", headers=ADMIN)).json()["data"]}
            if state["reranker"]["state"] != "loading":
                break
            await asyncio.sleep(0.05)
        reranker = state["reranker"]
        assert reranker["state"] == "failed" and "it was unloaded" in reranker["error"], reranker
        assert (await client.post("/v1/embeddings", json=body)).status_code == 200
        assert (await client.delete("/admin/models/reranker", headers=ADMIN)).status_code == 200


async def test_a_default_load_never_takes_unnamed_requests_and_two_loads_of_a_name_are_one(
    tiny_embedder: Path, tiny_reranker: Path
) -> None:
    """`serve --model-id X` marks nothing default, yet X answers the requests that name no
    model: a load marked default for the same task is a 409 too (it took them over silently),
    while one for another task is served. Two loads of one name sent at once: one is loaded,
    the other is a 409 (both were 202, the first left loading and never unloadable). A load
    without a name is served under its folder's, never its path; `~nosuchuser/x` is answered
    as any path outside the roots (it was a 500 that told which users exist)."""
    spec = spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                   admin_model_roots=[tiny_reranker.parent])
    async with serve_in_process(spec) as client:
        takeover = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_embedder), "served_model_name": "second", "default": True})
        assert takeover.status_code == 409 and "'embedder' is the default" in takeover.text, takeover.text
        reranker = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_reranker), "served_model_name": "reranker", "default": True,
            "backend": "torch"})
        assert reranker.status_code == 202, reranker.text
        twin = {"model_id": str(tiny_embedder), "served_model_name": "twin", "backend": "torch"}
        load = lambda: client.post("/admin/models", headers=ADMIN, json=twin)  # noqa: E731
        twice = await asyncio.gather(load(), load())
        assert sorted(t.status_code for t in twice) == [202, 409], [t.text for t in twice]
        unnamed = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": f"{tiny_reranker.parent}/zz/../{tiny_embedder.name}", "backend": "torch"})
        assert unnamed.status_code == 202 and unnamed.json()["id"] == tiny_embedder.name, unnamed.text
        users = await client.post("/admin/models", headers=ADMIN, json={"model_id": "~nosuchuser/x"})
        assert users.status_code == 400 and "not under a folder the admin API loads" in users.text, users.text
        for name in ("reranker", "twin", tiny_embedder.name):
            for _ in range(600):
                listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
                state = {m["id"]: m["state"] for m in listed}
                if state[name] != "loading":
                    break
                await asyncio.sleep(0.05)
            assert state[name] == "ready", state
        answered = await client.post("/v1/embeddings", json={"input": ["which model"]})
        assert answered.json()["model"] == "embedder", answered.text


async def test_a_load_reads_the_folder_once_and_a_name_loaded_again_calibrates_its_own_ranges(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot load reads the model folder's facts as it checks them, and loads from what it read;
    a model unloaded and loaded again under its name makes its own int8 ranges, as the first
    one did (they are the model's, dropped with it)."""
    from infinity_cloud.models import fleet as fleet_module
    from infinity_cloud.models import served_model

    reads: list[Path] = []
    read = fleet_module.read_model_info

    def counted(path: Path, *args: Any) -> Any:
        reads.append(path)
        return read(path, *args)

    monkeypatch.setattr(fleet_module, "read_model_info", counted)
    monkeypatch.setattr(served_model, "read_model_info", counted)

    async def load(engine: Engine) -> None:
        model = await engine.add_model(fake(tiny_embedder, "hot"))
        for _ in range(600):
            if model.state != "loading":
                break
            await asyncio.sleep(0.05)
        assert model.state == "ready", model.error

    spec = spec_of(fake(tiny_embedder, "first"), admin_model_roots=[tiny_embedder.parent])
    async with Engine(spec) as engine:
        reads.clear()  # the first model's, at start
        await load(engine)
        assert reads == [tiny_embedder.resolve()]
        first = await engine.embeddings(EmbedAsk(["x"], "hot", dtype="int8"))
        await engine.remove_model("hot")
        await load(engine)
        again = await engine.embeddings(EmbedAsk(["x"], "hot", dtype="int8"))
    np.testing.assert_array_equal(first.embeddings, again.embeddings)


async def test_a_model_hot_loaded_as_int8_is_calibrated_as_part_of_its_load(tiny_embedder: Path) -> None:
    """A model loaded through the admin API with `embedding_dtype: int8` was left uncalibrated
    once ready: the whole server's /health turned 503 and the model said "calibrating" until a
    caller's request started it (and got the 503). Its ranges are now made as it loads: the
    server stays healthy, the model turns ready with them, and its first answer is a 200."""
    roots = [tiny_embedder.parent]
    async with serve_in_process(spec_of(embedder(tiny_embedder), admin_keys=["admin-secret"],
                                        admin_model_roots=roots)) as client:
        loaded = await client.post("/admin/models", headers=ADMIN, json={
            "model_id": str(tiny_embedder), "served_model_name": "q", "embedding_dtype": "int8",
            "backend": FAKE})
        assert loaded.status_code == 202, loaded.text
        healths = []
        for _ in range(1200):
            healths.append((await client.get("/health")).status_code)
            listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
            states = {m["id"]: m["state"] for m in listed}
            if states["q"] not in ("loading", "calibrating"):
                break
            await asyncio.sleep(0.05)
        assert states == {"embedder": "ready", "q": "ready"}
        first = await client.post("/v1/embeddings", json={"model": "q", "input": ["hello"]})
        assert (await client.get("/health")).status_code == 200
    assert set(healths) == {200}, "the model served before kept the server healthy"
    assert first.status_code == 200, first.text
    assert all(isinstance(v, int) for v in first.json()["data"][0]["embedding"])
