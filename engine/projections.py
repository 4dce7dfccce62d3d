"""The decoder layer's linear projections, by the names Hugging Face Llama checkpoints
use: what the model (engine/llama.py) holds and what an adapter may target
(engine/lora.py). Torch-free, so the command line reads them without loading PyTorch."""

from __future__ import annotations

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
