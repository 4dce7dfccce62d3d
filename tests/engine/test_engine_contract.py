"""The engine contract, on both engines: what rlgate sends and reads of SGLang's native
protocol (core/engine_protocol.py, over core/engine_http.py and the gateway's aiohttp
client), checked on the embedded engine and on real SGLang (the version in the test id,
asserted against the server's /get_server_info by the ``sglang`` fixture).

Generation payloads and answers, logprobs and top logprobs, seeds, streaming, abort,
structured output, a batch mixing the base model and two adapters, LoRA load / unload /
on-demand re-load and the live-path fence that retires a version for good. Publish,
rollback and adapter sync on both engines: test_engine_adapters.py. Tokens are few:
SGLang on one CPU thread makes about 10 per second.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from core import engine_adapters
from core import engine_protocol as proto
from core.engine_http import EngineHTTP
from core.live_adapters import drop_live, make_live
from core.regex_ebnf import ebnf_string, regex_to_ebnf
from gateway.engines.engine_client import EngineClient
from tests.engine.conftest import Target

pytestmark = pytest.mark.timeout(300)

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2]  # small ids valid for any vocab
GREEDY = proto.Sampling(max_new_tokens=4, values=proto.GREEDY)


def _engine(target: Target) -> EngineHTTP:
    return EngineHTTP(target.url, target.headers, 120)


def _one(engine: EngineHTTP, sampling: proto.Sampling = GREEDY, **kw) -> proto.Output:  # type: ignore[no-untyped-def]
    answer = engine.generate(proto.generate_body(PROMPT, sampling, **kw))
    assert isinstance(answer, dict)  # one prompt: one object, as SGLang answers
    return proto.read_output(answer)


def _versioned(root: Path, src: Path, name: str) -> Path:
    """A version stored as the trainer stores it: <root>/<project>/<name>."""
    dst = root / "proj" / name
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def test_info_routes(target: Target) -> None:
    with _engine(target) as e:
        assert e.client.get(target.url + proto.HEALTH).status_code == 200
        info = e.get(proto.MODEL_INFO)
        assert info["is_generation"] is True and engine_adapters.weight_version(info) == "default"
        # SGLang 0.5.23 has no /get_weight_version; the embedded engine neither
        assert e.client.get(target.url + "/get_weight_version").status_code == 404
        server = e.get(proto.SERVER_INFO)
        assert server["version"] == target.version
        assert int(server["context_length"]) >= 1024
        models = e.get(proto.MODELS)
        assert models["data"][0]["parent"] is None


def test_generate_answer_logprobs_and_top(target: Target) -> None:
    with _engine(target) as e:
        out = _one(e, rid="contract-one", top_logprobs=2)
    assert out.rid == "contract-one" and out.prompt_tokens == len(PROMPT)
    assert 1 <= len(out.ids) <= 4 and len(out.logprobs) == len(out.ids)
    assert all(lp <= 0.0 for lp in out.logprobs)
    assert out.finish_reason in ("stop", "length") and out.weight_version == "default"
    assert out.top is not None and len(out.top) == len(out.ids)
    for (tid, lp), pos in zip(zip(out.ids, out.logprobs, strict=True), out.top, strict=True):
        assert len(pos) == 2
        assert pos[0][0] == tid and pos[0][1] == pytest.approx(lp, abs=1e-5)  # greedy: top-1


def test_prompt_logprobs_from_logprob_start_len(target: Target, hf_model) -> None:  # type: ignore[no-untyped-def]
    """``logprob_start_len`` 0 returns the prompt's logprobs, the first None, each later
    one log p(token j | tokens before j) of the unscaled model (the reference: HF), with
    the top alternatives (None first); -1 (SGLang's default) returns none."""
    import torch

    one = proto.Sampling(max_new_tokens=1, values={"temperature": 0.7})
    with _engine(target) as e:
        out = _one(e, one, top_logprobs=2, logprob_start_len=0)
        plain = _one(e, one)
    assert plain.prompt_logprobs is None
    lps = out.prompt_logprobs
    assert lps is not None and len(lps) == len(PROMPT) and lps[0] is None
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPT])).logits[0].float()
    want = torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(PROMPT[1:])[:, None])
    assert lps[1:] == pytest.approx(want[:, 0].tolist(), abs=0.05)
    assert out.prompt_top is not None and out.prompt_top[0] is None
    assert len(out.prompt_top) == len(PROMPT)
    for pos, lp, tid in zip(out.prompt_top[1:], lps[1:], PROMPT[1:], strict=True):
        assert len(pos) == 2 and pos[0][1] >= pos[1][1]
        assert tid in dict(pos) or lp <= pos[1][1] + 1e-4


def test_prompt_logprobs_without_generating(target: Target) -> None:
    """``max_new_tokens`` 0 with ``logprob_start_len`` 0 (how /v1/completions scores a
    prompt: ``echo`` with ``max_tokens: 0``) returns the prompt's logprobs and no tokens
    (streamed: tests/gateway/test_completions_scoring.py)."""
    zero = proto.Sampling(max_new_tokens=0, values={"temperature": 0.0})
    with _engine(target) as e:
        out = _one(e, zero, logprob_start_len=0)
    assert out.ids == [] and out.finish_reason == "length"
    lps = out.prompt_logprobs
    assert lps is not None and len(lps) == len(PROMPT) and lps[0] is None
    assert all(lp is not None and lp <= 0 for lp in lps[1:])


def test_seed_is_accepted(target: Target) -> None:
    """rlgate sends a client's seed as ``sampling_seed``; SGLang refuses ``seed`` (400)."""
    seeded = proto.Sampling(max_new_tokens=3, values={"temperature": 1.0}, seed=1234)
    assert seeded.params()["sampling_seed"] == 1234 and "seed" not in seeded.params()
    with _engine(target) as e:
        first, second = _one(e, seeded), _one(e, seeded)
        raw = e.client.post(
            target.url + proto.GENERATE,
            json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "seed": 1}},
        )
    assert len(first.ids) == len(first.logprobs) > 0
    if target.kind == "embedded":  # reproducible; SGLang: only with deterministic inference
        assert first.ids == second.ids
        assert raw.status_code == 200  # the embedded engine also takes the old name
    else:
        assert raw.status_code == 400 and "seed" in proto.error_message(raw.content)


def test_batch_mixes_base_and_two_adapters(target: Target, adapter_dirs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    names = {k: f"mix-{k}-{target.kind}" for k in ("a", "b")}
    with _engine(target) as e:
        for k, name in names.items():
            live = make_live(_versioned(tmp_path, adapter_dirs[k], name))
            assert e.load(name, str(live)) == (True, "")
        try:
            adapters = [None, names["a"], names["b"]]
            answer = e.generate(proto.generate_body([PROMPT] * 3, [GREEDY] * 3, adapter=adapters))
            batch = [proto.read_output(o) for o in answer]
            alone = [_one(e, adapter=a) for a in adapters]
        finally:
            for name in names.values():
                e.unload(name)
    assert len(batch) == 3
    for got, want in zip(batch, alone, strict=True):
        assert got.ids == want.ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=2e-3)
    assert batch[1].logprobs != pytest.approx(batch[0].logprobs, abs=1e-3)  # adapters act


def test_streaming_through_the_gateway_client(target: Target) -> None:
    body = proto.generate_body(PROMPT, GREEDY, rid=proto.new_rid("contract-stream"))

    async def run() -> tuple[proto.Output, list[int], int]:
        client = EngineClient([target.url], api_key=target.api_key)
        try:
            answer, _ = await client.generate(body, "s")
            reader, sizes = proto.StreamReader(), []
            async with client.stream(body, "s") as (chunks, _):
                async for chunk in chunks:
                    sizes.append(len(reader.feed(chunk).ids))
            return proto.read_output(answer), reader.output().ids, sum(sizes)
        finally:
            await client.close()

    whole, streamed, total = asyncio.run(run())
    assert streamed == whole.ids and total == len(whole.ids)


def test_abort_ends_a_running_request(target: Target) -> None:
    rid = proto.new_rid("contract-abort")
    long = proto.Sampling(max_new_tokens=400, values={"temperature": 0.0})
    body = proto.generate_body(PROMPT, long, rid=rid)
    body["sampling_params"]["ignore_eos"] = True
    result: dict[str, object] = {}
    with _engine(target) as e:

        def call() -> None:
            result["out"] = _one_body(e, body)

        t = threading.Thread(target=call)
        t.start()
        time.sleep(1.5)
        r = e.client.post(target.url + proto.ABORT, json=proto.abort_body(rid))
        t.join(120)
        assert r.status_code == 200
        assert e.client.post(target.url + proto.ABORT, json={"rid": "none"}).status_code == 200
    out = result["out"]
    assert isinstance(out, proto.Output)
    assert out.finish_reason == "abort" and len(out.ids) < 400


def _one_body(e: EngineHTTP, body: dict) -> proto.Output:  # type: ignore[type-arg]
    return proto.read_output(e.generate(body))


def test_structured_output_json_schema(target: Target) -> None:
    schema = json.dumps({"type": "string", "enum": ["yes", "no"]})
    sampling = proto.Sampling(max_new_tokens=8, values={"temperature": 1.0}, json_schema=schema)
    with _engine(target) as e:
        outs = [_one(e, sampling) for _ in range(2)]
    for out in outs:
        assert json.loads(out.text) in ("yes", "no"), out.text


def test_structural_tag_forces_tagged_json(target: Target) -> None:
    """What forced tool calls send (gateway/call/forced_tools.py): one or more tagged values,
    each valid against its own schema (the same ``$defs`` name, its own values), and
    nothing else; with ``stop_after_first`` exactly one."""

    def schema(values: list[str]) -> dict:  # type: ignore[type-arg]
        return {
            "type": "object",
            "properties": {"v": {"$ref": "#/$defs/V"}},
            "required": ["v"],
            "additionalProperties": False,
            "$defs": {"V": {"enum": values}},
        }

    schemas = {"a": schema(["x", "y"]), "b": schema(["z"])}
    tags = [proto.Tag(f"<{n}>", s, f"</{n}>") for n, s in schemas.items()]
    pattern = re.compile(r"<(a|b)>(.*?)</\1>", re.S)
    with _engine(target) as e:
        for stop_after_first in (True, False):
            tag = proto.structural_tag(
                tags, ";", at_least_one=True, stop_after_first=stop_after_first
            )
            out = _one(
                e,
                proto.Sampling(
                    max_new_tokens=96,
                    values={"temperature": 1.0},
                    seed=7,  # unseeded, a sample once wandered into whitespace for 40 tokens
                    structural_tag=tag,
                ),
            )
            found = pattern.findall(out.text)
            assert found, out.text
            if out.finish_reason == "stop":  # else cut short by max_new_tokens
                assert ";".join(f"<{n}>{v}</{n}>" for n, v in found) == out.text
                assert len(found) == 1 or not stop_after_first
            for name, value in found:
                jsonschema.validate(json.loads(value), schemas[name])
            assert len(out.logprobs) == len(out.ids)


def test_structural_tag_grammar_and_text_content(target: Target) -> None:
    """What forced custom tool calls send (gateway/call/custom_tools.py): a tag whose content is
    an EBNF grammar (raw text: newlines and quotes need no escapes) or any text up to the
    end; and under a grammar admitting exactly the free greedy answer, the same tokens with
    logprobs of the masked distribution (renormalized: never lower, higher in sum)."""
    words = regex_to_ebnf(r'"[a-z]{2,4}"\n[0-9]{2}')
    grammar = {"type": "grammar", "grammar": f"root ::= {words}\n"}
    with _engine(target) as e:
        for content, pattern in (
            (grammar, r'"[a-z]{2,4}"\n[0-9]{2}'),
            ({"type": "any_text"}, ".*"),
        ):
            tag = proto.structural_tag(
                [proto.Tag("<a>\n", {}, "\n</a>", content=content)],
                "",
                at_least_one=True,
                stop_after_first=True,
            )
            sampling = proto.Sampling(
                max_new_tokens=24, values={"temperature": 0.0}, structural_tag=tag
            )
            out = _one(e, sampling)
            if out.finish_reason == "stop" or content is grammar:
                m = re.fullmatch(r"<a>\n(.*)\n</a>", out.text, re.S)
                assert m and re.fullmatch(pattern, m.group(1), re.S), out.text
        prompt = [*PROMPT, 198, 1, 520, 9531, 198]  # + "\n<|im_start|>assistant\n": plain text
        free = _one_body(e, proto.generate_body(prompt, proto.Sampling(6, {"temperature": 0.0})))
        exact = {"type": "grammar", "grammar": f"root ::= {ebnf_string(free.text)}\n"}
        tag = json.dumps({"type": "structural_tag", "format": exact})
        sampling = proto.Sampling(6, {"temperature": 0.0}, structural_tag=tag)
        masked = _one_body(e, proto.generate_body(prompt, sampling))
    assert masked.text == free.text and masked.ids == free.ids
    assert all(m >= f - 1e-4 for m, f in zip(masked.logprobs, free.logprobs, strict=True))
    assert sum(masked.logprobs) > sum(free.logprobs) + 1e-3


def test_lora_load_unload_reload_and_the_live_fence(target: Target, adapter_dirs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SGLang re-loads an unloaded adapter on demand from its path (so does the embedded
    engine); once its live directory is gone, a request naming it is refused (400, and an
    error event inside a 200 stream), nothing hangs, and the engine stays healthy; the
    version can be loaded again later (a rollback)."""
    name = f"fence-{target.kind}"
    stored = _versioned(tmp_path, adapter_dirs["a"], name)
    live = make_live(stored)
    with _engine(target) as e:
        assert e.load(name, str(live)) == (True, "")
        assert e.load(name, str(live))[0]  # already loaded counts as loaded
        assert e.adapters()[name] == str(live)
        served = _one(e, adapter=name)
        assert e.unload(name)[0] and name not in e.adapters()
        assert _one(e, adapter=name).ids == served.ids  # re-loaded from its path
        assert name in e.adapters()
        drop_live(stored)
        assert e.unload(name)[0] and name not in e.adapters()
        started = time.monotonic()
        with pytest.raises(proto.EngineRefused) as refused:
            _one(e, adapter=name)
        assert refused.value.status == 400 and name in refused.value.message
        with e.client.stream(
            "POST",
            target.url + proto.GENERATE,
            json=proto.generate_body(PROMPT, GREEDY, adapter=name, stream=True),
        ) as r:
            lines = [line.encode() for line in r.iter_lines() if line]
        assert time.monotonic() - started < 30  # refused at once, not after a wait
        with pytest.raises(proto.EngineRefused) as in_stream:
            for line in lines:
                proto.stream_event(line)
        assert in_stream.value.status == 400
        assert name not in e.adapters() and e.client.get(target.url + "/health").status_code == 200
        assert e.unload(name)[0]  # not held: unloading again is done already
        with pytest.raises(proto.EngineRefused):
            _one(e, adapter="never-loaded-anywhere")
        # a rollback: the live directory again, then the load
        live = make_live(stored)
        assert e.load(name, str(live)) == (True, "")
        assert _one(e, adapter=name).ids == served.ids
        assert e.unload(name)[0]
        ok, message = e.load("missing", str(tmp_path / "no-such-adapter"))
        assert not ok and message
        ok, message = e.load("too-big", str(adapter_dirs["too_big"]))
        assert not ok and "rank" in message.lower()
