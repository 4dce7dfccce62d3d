"""A fast stub upstream for measuring proxy overhead (bench only, never used by tests).

It answers instantly and identically in two protocols: OpenAI chat completions (for the
direct baseline and LiteLLM's proxy) and SGLang's native /generate (for rlgate). A stub is
the right upstream here: it removes model time, so what remains is each proxy's own cost.

``/generate`` with ``"stream": true`` streams as SGLang does: server-sent events
``data: {...}`` whose ``text``, ``output_ids`` and ``meta_info.output_token_logprobs`` are
cumulative (each chunk carries everything so far; ``finish_reason`` is null until the last
chunk), then ``data: [DONE]``. ``--token-delay-ms`` spaces the tokens of a stream.

    python bench/stub_upstream.py --port 31000 [--token-delay-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

# "Hello there, how can I help?" + <|im_end|> in SmolLM2's vocabulary (any ids would do)
IDS = [19556, 665, 28, 638, 416, 339, 724, 47, 2]
TEXT = "Hello there, how can I help?"
# the text after each token of IDS (what a tokenizer decode of the prefix gives)
PIECES = ["Hello", " there", ",", " how", " can", " I", " help", "?", ""]
TOKEN_DELAY_S = 0.0


async def chat(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "stub",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": TEXT},
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": len(IDS), "total_tokens": 29},
        }
    )


def _meta(rid: str, prompt: int, n: int, final: bool) -> dict:
    return {
        "id": rid,
        "finish_reason": {"type": "stop", "matched": 2} if final else None,
        "prompt_tokens": prompt,
        "completion_tokens": n,
        "cached_tokens": 0,
        "output_token_logprobs": [[-0.5, i, None] for i in IDS[:n]],
        "weight_version": "stub",
        "e2e_latency": 0.0,
    }


async def _stream(rid: str, prompt: int) -> AsyncIterator[bytes]:
    for n in range(1, len(IDS) + 1):
        if TOKEN_DELAY_S:
            await asyncio.sleep(TOKEN_DELAY_S)
        final = n == len(IDS)
        chunk = {
            "text": "".join(PIECES[:n]),
            "output_ids": IDS[:n],
            "meta_info": _meta(rid, prompt, n, final),
        }
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def generate(request: Request) -> JSONResponse | StreamingResponse:
    body = await request.json()
    if body.get("stream"):
        rid, prompt = body.get("rid") or "stub", len(body.get("input_ids", []))
        return StreamingResponse(_stream(rid, prompt), media_type="text/event-stream")
    return JSONResponse(
        {
            "text": TEXT,
            "output_ids": IDS,
            "meta_info": {
                "id": body.get("rid", "stub"),
                "finish_reason": {"type": "stop", "matched": 2},
                "prompt_tokens": len(body.get("input_ids", [])),
                "completion_tokens": len(IDS),
                "cached_tokens": 0,
                "output_token_logprobs": [[-0.5, i, None] for i in IDS],
                "weight_version": "stub",
                "e2e_latency": 0.0,
            },
        }
    )


async def health(request: Request) -> JSONResponse:
    return JSONResponse({})


async def abort_request(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({})


async def server_info(request: Request) -> JSONResponse:
    return JSONResponse({"context_length": 8192})


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
        Route("/health", health),
        Route("/get_server_info", server_info),
    ]
)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument(
        "--token-delay-ms",
        type=float,
        default=0.0,
        help="pause before each token of a streamed /generate",
    )
    args = ap.parse_args()
    TOKEN_DELAY_S = args.token_delay_ms / 1000
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
