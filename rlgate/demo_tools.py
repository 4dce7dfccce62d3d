"""The tool demo's task: pick the right lookup tool, call it, answer with its value.

The agent offers three tools, ``get_stock``, ``get_price`` and ``get_weight``, each
taking an ``item``. A question asks one of the three about one item ("How many dollars
does one blue lamp cost? Reply with only the number."); the values are drawn per seed,
so no answer can be known without the right tool. Three worked sessions come first in
the chat (one per tool), as an agent's prompt would carry them.

A session is a real tool loop through the gateway (``run_session``): the agent opens a
session, asks, executes each tool call the gateway parsed (an unknown tool or item gets
an error result, as a real tool would), sends the result back as a ``tool`` message in
the same session, and stops at the first answer without a tool call (or after
``MAX_TURNS`` requests). The only reward is one rating of the whole session at its end:
1 when the final answer is exactly the asked value, 0 otherwise.

What the packaged model does without training (measured, see docs/demo.md): with one
worked session it writes a made-up ``<tool_response>`` instead of a call; with one per
tool it calls a tool in the right format almost always, copies the item and the value
well, but tends to call the tool of the nearest example whatever the question asks.
That choice is what the demo learns.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

COLORS = ("red", "blue", "green", "black", "white", "yellow", "brown", "gray", "pink", "orange")
THINGS = (
    "lamp", "chair", "table", "cup", "plate", "bowl", "spoon", "knife", "towel", "pillow",
    "clock", "mirror", "basket", "bottle", "candle", "brush", "shirt", "sock", "hat", "bag",
)  # fmt: skip
ITEM = {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}
# tool name -> (description, question, result key, value range)
KINDS: dict[str, tuple[str, str, str, tuple[int, int]]] = {
    "get_stock": (
        "How many units of an item the shop has in stock.",
        "How many {item}s does the shop have in stock? Reply with only the number.",
        "in_stock",
        (10, 99),
    ),
    "get_price": (
        "The price of one unit of an item, in dollars.",
        "How many dollars does one {item} cost? Reply with only the number.",
        "price_usd",
        (2, 60),
    ),
    "get_weight": (
        "The weight of one unit of an item, in grams.",
        "How many grams does one {item} weigh? Reply with only the number.",
        "weight_g",
        (100, 900),
    ),
}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": ITEM}}
    for n, (d, *_rest) in KINDS.items()
]
# the worked sessions, one per tool: (tool, item, value)
EXAMPLES = (
    ("get_stock", "green cup", 12),
    ("get_price", "red hat", 9),
    ("get_weight", "gray sock", 140),
)
MAX_TURNS = 3  # requests per session: the tool call, the answer, one spare
MAX_TOKENS = 40  # a tool call is ~25 tokens, an answer 1-3


@dataclass(frozen=True)
class Question:
    tool: str
    item: str

    def prompt(self) -> str:
        return KINDS[self.tool][1].format(item=self.item)


Facts = dict[tuple[str, str], int]  # (tool, item) -> value


def all_items() -> list[str]:
    examples = {item for _, item, _ in EXAMPLES}
    return sorted(f"{c} {t}" for c in COLORS for t in THINGS if f"{c} {t}" not in examples)


def facts(seed: int) -> Facts:
    """The shop's data, drawn per seed; the worked examples' values are fixed."""
    rng = random.Random(f"facts-{seed}")
    out = {(tool, item): rng.randint(*KINDS[tool][3]) for tool in KINDS for item in all_items()}
    out.update({(tool, item): value for tool, item, value in EXAMPLES})
    return out


def split_questions(
    eval_size: int, seed: int, gate_size: int
) -> tuple[list[Question], list[Question], list[Question]]:
    """(train, held-out, validation): disjoint in their items (a held-out item was never
    looked up in training), each item asked with a tool drawn at random."""
    items = all_items()
    if eval_size + gate_size >= len(items):
        raise ValueError(f"eval size + gate size must stay below {len(items)} items")
    rng = random.Random(seed)
    rng.shuffle(items)
    tools = sorted(KINDS)

    def ask(names: list[str]) -> list[Question]:
        return [Question(rng.choice(tools), n) for n in names]

    held, val = ask(items[:eval_size]), ask(items[eval_size : eval_size + gate_size])
    train = [Question(t, n) for n in items[eval_size + gate_size :] for t in tools]
    return train, held, val


def _worked(tool: str, item: str, value: int, call_id: str) -> list[dict]:
    call = {"name": tool, "arguments": json.dumps({"item": item})}
    return [
        {"role": "user", "content": Question(tool, item).prompt()},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result(tool, value)},
        {"role": "assistant", "content": str(value)},
    ]


def first_messages(q: Question) -> list[dict]:
    """The worked sessions, then the question."""
    worked = [m for i, ex in enumerate(EXAMPLES) for m in _worked(*ex, f"call_{i}")]
    return [*worked, {"role": "user", "content": q.prompt()}]


def result(tool: str, value: int) -> str:
    return json.dumps({KINDS[tool][2]: value})


def run_tool(name: str, arguments: str, known: Facts) -> str:
    """What the tool returns: the value, or the error a real tool would give."""
    if name not in KINDS:
        return json.dumps({"error": f"unknown tool {name!r}; the tools are {sorted(KINDS)}"})
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return json.dumps({"error": "arguments are not JSON"})
    item = str(args.get("item", "")).strip().lower() if isinstance(args, dict) else ""
    if (name, item) not in known and (name, item.removesuffix("s")) in known:
        item = item.removesuffix("s")
    if (name, item) not in known:
        return json.dumps({"error": f"no item {item!r}"})
    return result(name, known[(name, item)])


def exact_match(text: str | None, expected: int) -> bool:
    """The answer is the number and nothing else (a trailing period is forgiven)."""
    return (text or "").strip().rstrip(".").strip() == str(expected)


@dataclass
class Episode:
    """One session's outcome."""

    session_id: str
    answer: str | None
    correct: bool
    version: str


async def run_session(http, q: Question, known: Facts, *, temperature: float, seed: int) -> Episode:
    """One tool loop through the gateway: a session of its own (``POST /v1/sessions``,
    task ``q.tool``), then requests with the session's key until an answer comes without
    a tool call. ``http`` is an ``httpx.AsyncClient`` on the gateway with an agent key."""
    from rlgate.demo_http import openai_client

    r = await http.post("/v1/sessions", json={"task_id": q.tool, "agent_name": "rlgate demo"})
    r.raise_for_status()
    session = r.json()
    client = openai_client(str(http.base_url), session["api_key"])
    messages = first_messages(q)
    answer, version = None, "?"
    try:
        for turn in range(MAX_TURNS):
            raw = await client.chat.completions.with_raw_response.create(
                model="rlgate-policy",
                messages=messages,
                tools=TOOLS,
                temperature=temperature,
                max_tokens=MAX_TOKENS,
                seed=seed + turn,
            )
            version = raw.headers.get("x-rlgate-policy-version", "?")
            msg = raw.parse().choices[0].message
            if not msg.tool_calls:
                answer = msg.content
                break
            messages.append(msg.model_dump(include={"role", "content", "tool_calls"}))
            for c in msg.tool_calls:
                out = run_tool(c.function.name, c.function.arguments, known)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    finally:
        await client.close()
    correct = exact_match(answer, known[(q.tool, q.item)])
    return Episode(session["id"], answer, correct, version)


def eval_gate(model_dir, validation: list[Question], context_length: int) -> dict:
    """The tool demo's eval gate (trainer/eval_gate.py): the first request of each
    validation question, rendered exactly as the gateway renders it (its own renderer,
    the tools as its Hermes system prompt), greedy; the registered ``contains`` verifier
    checks that the output calls the tool the question needs."""
    from gateway.api.openai_chat.translator import parse_messages, parse_tools
    from gateway.call.templating import ChatRenderer, load_tokenizer

    renderer = ChatRenderer(load_tokenizer(model_dir), context_length)
    tools = parse_tools(TOOLS)
    prompts = []
    for q in validation:
        _, ids = renderer.render(parse_messages(first_messages(q)), tools)
        prompts.append({"input_ids": ids, "expected": f'"name": "{q.tool}"'})
    return {
        "enabled": True,
        "verifier": "contains",
        "prompts": prompts,
        "max_new_tokens": MAX_TOKENS,
        "margin": 0.125,  # as the arithmetic demo's: 2 questions in 32 on [-1, 1]
    }
