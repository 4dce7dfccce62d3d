"""A fast stub upstream for measuring proxy overhead (bench only, never used by tests).

It answers instantly and identically in two protocols: OpenAI chat completions (for the
direct baseline and LiteLLM's proxy) and SGLang's native /generate (for rlgate). A stub is
the right upstream here: it removes model time, so what remains is each proxy's own cost.

    python bench/stub_upstream.py --port 31000
"""

from __future__ import annotations

import argparse
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

# "Hello there, how can I help?" + <|im_end|> in SmolLM2's vocabulary (any ids would do)
IDS = [19556, 665, 28, 638, 416, 339, 724, 47, 2]
TEXT = "Hello there, how can I help?"


async def chat(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({
        "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
        "model": "stub", "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": TEXT}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": len(IDS), "total_tokens": 29},
    })


async def generate(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse({
        "text": TEXT, "output_ids": IDS,
        "meta_info": {"id": body.get("rid", "stub"), "finish_reason": {"type": "stop",
                                                                       "matched": 2},
                      "prompt_tokens": len(body.get("input_ids", [])),
                      "completion_tokens": len(IDS), "cached_tokens": 0,
                      "output_token_logprobs": [[-0.5, i, None] for i in IDS],
                      "weight_version": "stub", "e2e_latency": 0.0},
    })


async def health(request: Request) -> JSONResponse:
    return JSONResponse({})


async def server_info(request: Request) -> JSONResponse:
    return JSONResponse({"context_length": 8192})


app = Starlette(routes=[
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/generate", generate, methods=["POST"]),
    Route("/health", health),
    Route("/get_server_info", server_info),
])

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=31000)
    args = ap.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
