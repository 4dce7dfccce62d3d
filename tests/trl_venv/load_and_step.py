"""Run in the TRL venv (scripts/trl_venv): load rlgate's TRL exports as they are, train a step.

argv: MODEL_DIR SFT.jsonl PREFERENCE.jsonl KTO.jsonl OUT_DIR. Prints one JSON line:
the row counts and columns `datasets` read, and each trainer's logged loss.
"""

import json
import sys

import datasets
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, SFTConfig, SFTTrainer

model_dir, sft, pref, kto, out = sys.argv[1:6]
report: dict = {}
loaded = {}
for name, path in (("sft", sft), ("preference", pref), ("kto", kto)):
    ds = datasets.load_dataset("json", data_files=path, split="train")
    loaded[name] = ds
    report[name] = {"rows": len(ds), "columns": sorted(ds.column_names)}

tok = AutoTokenizer.from_pretrained(model_dir)
common = dict(
    max_steps=1,
    per_device_train_batch_size=2,
    report_to=[],
    save_strategy="no",
    use_cpu=True,
    logging_steps=1,
)


def loss(trainer) -> float:
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h or "train_loss" in h][0].get(
        "loss", trainer.state.log_history[-1].get("train_loss")
    )


model = AutoModelForCausalLM.from_pretrained(model_dir)
report["sft"]["loss"] = loss(
    SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=f"{out}/sft", max_length=256, **common),
        train_dataset=loaded["sft"],
        processing_class=tok,
    )
)
model = AutoModelForCausalLM.from_pretrained(model_dir)
report["preference"]["loss"] = loss(
    DPOTrainer(
        model=model,
        args=DPOConfig(output_dir=f"{out}/dpo", max_length=256, **common),
        train_dataset=loaded["preference"],
        processing_class=tok,
    )
)
model = AutoModelForCausalLM.from_pretrained(model_dir)
report["kto"]["loss"] = loss(
    KTOTrainer(
        model=model,
        args=KTOConfig(output_dir=f"{out}/kto", max_length=256, **common),
        train_dataset=loaded["kto"],
        processing_class=tok,
    )
)
print(json.dumps(report))
