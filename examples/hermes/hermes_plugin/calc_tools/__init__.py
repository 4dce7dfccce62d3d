"""Hermes Agent plugin of the rlgate example: a calculator and a unit converter.

Loaded by Hermes from ``$HERMES_HOME/plugins/calc_tools/`` (``examples/hermes/run.py``
copies it there and enables it with ``plugins.enabled: [calc_tools]`` in config.yaml).
Both tools belong to the toolset ``calc``; run Hermes with ``--toolsets calc``.

Every call is appended as one JSON line to ``$CALC_TOOLS_LOG`` when that is set, so the
example's simulated user can see whether the agent used a tool.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import os
from collections.abc import Callable
from typing import Any

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., float]] = {"sqrt": math.sqrt, "abs": abs, "round": round}

# unit -> (dimension, factor to the SI base unit); temperatures are handled apart
_UNITS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "cm": ("length", 0.01),
    "mm": ("length", 0.001),
    "mi": ("length", 1609.344),
    "mile": ("length", 1609.344),
    "miles": ("length", 1609.344),
    "ft": ("length", 0.3048),
    "feet": ("length", 0.3048),
    "foot": ("length", 0.3048),
    "in": ("length", 0.0254),
    "inch": ("length", 0.0254),
    "inches": ("length", 0.0254),
    "kg": ("mass", 1.0),
    "g": ("mass", 0.001),
    "lb": ("mass", 0.45359237),
    "lbs": ("mass", 0.45359237),
    "pound": ("mass", 0.45359237),
    "pounds": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125),
    "l": ("volume", 1.0),
    "liter": ("volume", 1.0),
    "liters": ("volume", 1.0),
    "ml": ("volume", 0.001),
    "gal": ("volume", 3.785411784),
    "gallon": ("volume", 3.785411784),
    "gallons": ("volume", 3.785411784),
}
_TEMPS = {"c", "celsius", "f", "fahrenheit", "k", "kelvin"}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        return _FUNCS[node.func.id](*(_eval(a) for a in node.args))
    raise ValueError(f"unsupported expression: {ast.dump(node)[:60]}")


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression (+ - * / // % ** sqrt abs round)."""
    text = expression.replace("^", "**").replace("×", "*").replace("x", "*")
    return _eval(ast.parse(text, mode="eval"))


def _to_kelvin(value: float, unit: str) -> float:
    if unit in ("c", "celsius"):
        return value + 273.15
    if unit in ("f", "fahrenheit"):
        return (value - 32.0) * 5.0 / 9.0 + 273.15
    return value


def _from_kelvin(value: float, unit: str) -> float:
    if unit in ("c", "celsius"):
        return value - 273.15
    if unit in ("f", "fahrenheit"):
        return (value - 273.15) * 9.0 / 5.0 + 32.0
    return value


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert between length, mass, volume and temperature units."""
    src, dst = from_unit.strip().lower(), to_unit.strip().lower()
    if src in _TEMPS and dst in _TEMPS:
        return _from_kelvin(_to_kelvin(value, src), dst)
    if src not in _UNITS or dst not in _UNITS:
        raise ValueError(f"unknown unit; known: {sorted(_UNITS) + sorted(_TEMPS)}")
    (dim_a, fa), (dim_b, fb) = _UNITS[src], _UNITS[dst]
    if dim_a != dim_b:
        raise ValueError(f"cannot convert {dim_a} to {dim_b}")
    return value * fa / fb


def _log(tool: str, args: dict[str, Any], result: str) -> None:
    path = os.environ.get("CALC_TOOLS_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tool": tool, "args": args, "result": result}) + "\n")


def _number(x: float) -> str:
    return f"{x:.6g}" if isinstance(x, float) and not float(x).is_integer() else str(int(x))


def handle_calculator(args: dict[str, Any], **_: Any) -> str:
    try:
        out = json.dumps({"result": _number(calculate(str(args.get("expression", ""))))})
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError, OverflowError) as e:
        out = json.dumps({"error": str(e)})
    _log("calculator", args, out)
    return out


def handle_convert_units(args: dict[str, Any], **_: Any) -> str:
    try:
        value = float(args.get("value", "nan"))
        result = convert(value, str(args.get("from_unit", "")), str(args.get("to_unit", "")))
        out = json.dumps({"result": _number(result), "unit": args.get("to_unit")})
    except (ValueError, TypeError) as e:
        out = json.dumps({"error": str(e)})
    _log("convert_units", args, out)
    return out


CALCULATOR_SCHEMA = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression, e.g. '37*41' or '(12+5)/4'.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}
CONVERT_SCHEMA = {
    "name": "convert_units",
    "description": "Convert a value between units (km, mi, m, ft, in, kg, lb, oz, l, gal, C, F).",
    "parameters": {
        "type": "object",
        "properties": {
            "value": {"type": "number"},
            "from_unit": {"type": "string"},
            "to_unit": {"type": "string"},
        },
        "required": ["value", "from_unit", "to_unit"],
    },
}


def register(ctx: Any) -> None:
    """Called once by Hermes' plugin loader."""
    ctx.register_tool(
        name="calculator",
        toolset="calc",
        schema=CALCULATOR_SCHEMA,
        handler=handle_calculator,
        emoji="🧮",
    )
    ctx.register_tool(
        name="convert_units",
        toolset="calc",
        schema=CONVERT_SCHEMA,
        handler=handle_convert_units,
        emoji="📏",
    )
