"""Request types of the SGLang native protocol subset the embedded engine speaks.

Field names and defaults follow SGLang's ``GenerateReqInput`` and ``SamplingParams``.
Validation errors become HTTP 400 with ``{"error": {"message": ...}}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.sampling import SamplingParams

MAX_N = 64
# Seeds are 64-bit signed integers, as SGLang's int64 sampling tensors and torch's
# Generator.manual_seed take them; anything larger is refused before an adapter is acquired.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1


class ProtocolError(ValueError):
    """A request that cannot be served as sent; the message says what to change."""


class SamplingParamsIn(BaseModel):
    """SGLang's sampling_params. Unknown keys are refused; unsupported features must
    keep their neutral defaults."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(128, ge=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = None
    sampling_seed: int | None = None
    # SGLang's ranges (SamplingParams.verify): [-2, 2]
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    # Accepted only at their neutral values (the embedded engine does not implement them).
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[str, float] | None = None
    custom_params: dict[str, Any] | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    @field_validator("seed", "sampling_seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not SEED_MIN <= v <= SEED_MAX:
            raise ValueError(f"must be a 64-bit signed integer, in [{SEED_MIN}, {SEED_MAX}]")
        return v

    @model_validator(mode="after")
    def _neutral(self) -> SamplingParamsIn:
        unsupported = {
            "repetition_penalty": (self.repetition_penalty, 1.0),
            "min_new_tokens": (self.min_new_tokens, 0),
            "logit_bias": (self.logit_bias or None, None),
        }
        for name, (value, neutral) in unsupported.items():
            if value != neutral:
                raise ValueError(f"{name} is not supported by the embedded engine; omit it")
        return self

    def constraint(self) -> tuple[str, str] | None:
        """The grammar constraint (``json_schema`` | ``regex`` | ``ebnf`` |
        ``structural_tag``, its text), if any."""
        kinds = ("json_schema", "regex", "ebnf", "structural_tag")
        given = [(k, v) for k in kinds if (v := getattr(self, k))]
        if len(given) > 1:
            raise ProtocolError(
                "only one of json_schema, regex, ebnf and structural_tag may be set "
                f"(got {[k for k, _ in given]})"
            )
        return given[0] if given else None

    def to_params(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(s == "" for s in stop):
            raise ProtocolError("stop strings must not be empty")
        return SamplingParams(
            max_new_tokens=128 if self.max_new_tokens is None else self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            stop=tuple(stop),
            stop_token_ids=frozenset(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            no_stop_trim=self.no_stop_trim,
            seed=self.seed if self.seed is not None else self.sampling_seed,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
        )


class GenerateReqInput(BaseModel):
    """``POST /generate``: one prompt or a batch, as ``input_ids`` or ``text``."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_path: str | list[str | None] | None = None


class GenerateItem(BaseModel):
    """One prompt of a (possibly batched) request, after normalisation."""

    index: int
    input_ids: list[int] | None
    text: str | None
    params: SamplingParamsIn
    rid: str | None
    return_logprob: bool
    logprob_start_len: int  # -1: output logprobs only; k >= 0: the prompt's from position k
    top_logprobs_num: int
    lora_name: str | None


def _pick(value: Any, i: int, batch: int, name: str) -> Any:
    if isinstance(value, list):
        if len(value) != batch:
            raise ProtocolError(f"{name} has {len(value)} entries for a batch of {batch}")
        return value[i]
    return value


def normalize(req: GenerateReqInput) -> tuple[list[GenerateItem], bool]:
    """Split a request into items; also return whether it was a single prompt."""
    if (req.text is None) == (req.input_ids is None):
        raise ProtocolError("send exactly one of input_ids or text")
    if req.input_ids is not None:
        ids = req.input_ids
        single = len(ids) == 0 or not isinstance(ids[0], list)
        prompts_ids: list[list[int] | None] = [ids] if single else list(ids)  # type: ignore[list-item]
        prompts_text: list[str | None] = [None] * len(prompts_ids)
    else:
        single = isinstance(req.text, str)
        prompts_text = [req.text] if single else list(req.text)  # type: ignore[arg-type,list-item]
        prompts_ids = [None] * len(prompts_text)
    batch = len(prompts_ids)
    if batch == 0:
        raise ProtocolError("the batch is empty")
    if single and isinstance(req.rid, list):
        raise ProtocolError("rid must be a string for a single prompt")
    items: list[GenerateItem] = []
    for i in range(batch):
        raw_params = _pick(req.sampling_params, i, batch, "sampling_params") or {}
        if not isinstance(raw_params, dict):
            raise ProtocolError("sampling_params must be an object")
        params = SamplingParamsIn.model_validate(raw_params)
        top_n = _pick(req.top_logprobs_num, i, batch, "top_logprobs_num") or 0
        if top_n < 0:
            raise ProtocolError("top_logprobs_num must be >= 0")
        start = _pick(req.logprob_start_len, i, batch, "logprob_start_len")
        start = -1 if start is None else int(start)
        if start < -1:
            raise ProtocolError("logprob_start_len must be -1 or a prompt position (>= 0)")
        items.append(
            GenerateItem(
                index=i,
                input_ids=prompts_ids[i],
                text=prompts_text[i],
                params=params,
                rid=_pick(req.rid, i, batch, "rid"),
                return_logprob=bool(_pick(req.return_logprob, i, batch, "return_logprob")),
                logprob_start_len=start,
                top_logprobs_num=int(top_n),
                lora_name=_pick(req.lora_path, i, batch, "lora_path"),
            )
        )
    return items, single


class LoadLoRAAdapterReqInput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    pinned: bool = False


class UnloadLoRAAdapterReqInput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str = Field(min_length=1)


class AbortReq(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: bool = False
