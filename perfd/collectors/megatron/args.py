"""Megatron-LM start-up output: the arguments block, the world-size line and friends, and how they
fill JobInfo (ParallelLayout, ModelSpec).

Megatron prints every argument of the run once, on rank 0 (``_print_args``)::

    ------------------------ arguments ------------------------
      bf16 ............................................ True
      ddp_param_name_patterns_for_fp32_local_accumulation  []
    -------------------- end of arguments ---------------------

The dots pad ``name + ' '`` to 48 columns, so names of 48+ characters get no dots, just two
spaces. Megatron of 2019 printed an ``arguments:`` header (29 columns) and no end marker.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from perfd.collectors.megatron.lines import to_int
from perfd.core.bounds import REASON as BOUNDS_REASON
from perfd.core.bounds import check_job_info
from perfd.core.model import ABSENT, PACKAGE_APEX, PACKAGE_TE, JobInfo

ARGS_HEADER_RE = re.compile(r"-{3,}\s*arguments\s*-{3,}")
ARGS_END_RE = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
OLD_ARGS_HEADER = "arguments:"
_ARG_LINE_RE = re.compile(r"  (?P<name>[A-Za-z_][A-Za-z0-9_]*) (?P<rest>.*)")

# "using world size: 2, data-parallel size: 1, context-parallel size: 1, hierarchical
# context-parallel sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 2";
# older: "data-parallel-size: 2", and one release lost the comma after the context-parallel size;
# 2019: "using world size: 16 and model-parallel size: 2" (model parallel = tensor parallel then).
_WORLD_SIZES_RE = re.compile(
    r"(?<![\w-])(?P<name>world|data[- ]parallel|context[- ]parallel|tensor[- ]model[- ]parallel"
    r"|pipeline[- ]model[- ]parallel|expert[- ]model[- ]parallel|model[- ]parallel)"
    r"[- ]size:\s*(?P<value>\d{1,18})(?!\d)"
)
_MICROBATCHES_RE = re.compile(r"setting number of micro-?batches to constant (?P<n>\d{1,18})(?!\d)")
_PADDED_VOCAB_RE = re.compile(
    r"padded vocab \(size: (?P<orig>\d{1,18})\) with (?P<dummy>\d{1,18}) dummy tokens"
    r" \(new size: (?P<new>\d{1,18})\)"
)
_VIRTUAL_STAGES_RE = re.compile(r"Number of virtual stages per pipeline stage: (?P<n>\d{1,18}(?!\d)|None)")

IssueSink = Callable[[str, str], None]  # (reason, text)


def parse_argument_line(line: str) -> tuple[str, str] | None:
    """``  name ....... value`` -> (name, value); value "" when Megatron printed an empty string."""
    m = _ARG_LINE_RE.fullmatch(line.rstrip("\r\n"))
    if m is None:
        return None
    rest = m["rest"]
    # "name" + " " + dots (none for 48+ character names) + " " + value: what follows the name's
    # space is a dot or a second space. Anything else ("  return func(*args)") is not an argument.
    if rest and not rest.startswith((".", " ")):
        return None
    rest = rest.lstrip(".")
    value = rest[1:] if rest.startswith(" ") else rest
    return m["name"], value.strip()


# What Megatron-LM prints of the optional packages at start-up: the Transformer Engine version line
# (0.0.0 when it is not installed, megatron/training/arguments.py) and the fallback warnings its
# modules give without them ("Transformer Engine and Apex are not installed. Falling back to ...",
# "Apex is not installed. Falling back to Torch Norm").
_TE_VERSION = "Transformer Engine version"
_NOT_INSTALLED = (("Transformer Engine and Apex are not installed", (PACKAGE_TE, PACKAGE_APEX)),
                  ("Apex is not installed", (PACKAGE_APEX,)),
                  ("Transformer Engine is not installed", (PACKAGE_TE,)))


def parse_packages(line: str) -> list[tuple[str, str]]:
    """(package, version or ABSENT) pairs a start-up line states; [] for any other line."""
    if "installed" in line:
        for text, names in _NOT_INSTALLED:
            if text in line:
                return [(n, ABSENT) for n in names]
        return []
    if _TE_VERSION in line:
        v = version_after(line, _TE_VERSION)
        if v is not None:
            return [(PACKAGE_TE, ABSENT if v.split("+")[0] == "0.0.0" else v)]
    return []


def version_after(line: str, label: str) -> str | None:
    """``> Megatron-Core version .......... 0.20.0`` -> "0.20.0" (split by hand: no regex)."""
    i = line.find(label)
    if i < 0:
        return None
    tokens = line[i + len(label):].lstrip(" .").split()
    return tokens[0] if tokens else None


def parse_world_sizes(line: str) -> dict[str, int]:
    """Sizes named on a ``using world size: ...`` line, keyed "world", "data-parallel", ..."""
    sizes = {m["name"].replace(" ", "-"): int(m["value"]) for m in _WORLD_SIZES_RE.finditer(line)}
    if "model-parallel" in sizes:
        sizes.setdefault("tensor-model-parallel", sizes.pop("model-parallel"))
    return sizes


def parse_microbatches(line: str) -> int | None:
    m = _MICROBATCHES_RE.search(line) if "microbatches" in line or "micro-batches" in line else None
    return int(m["n"]) if m else None


def parse_padded_vocab(line: str) -> tuple[int, int] | None:
    """(original, padded) vocabulary sizes."""
    m = _PADDED_VOCAB_RE.search(line) if "padded vocab" in line else None
    return (int(m["orig"]), int(m["new"])) if m else None


def parse_virtual_stages(line: str) -> tuple[bool, int | None]:
    """(matched, value) for ``Number of virtual stages per pipeline stage: 2|None``."""
    m = _VIRTUAL_STAGES_RE.search(line) if "virtual stages" in line else None
    if m is None:
        return False, None
    return True, (None if m["n"] == "None" else int(m["n"]))


# --------------------------------------------------------------------------------------------
# moe_layer_freq: an int, or a list printed by Python ("[1, 0, 1]"), or (as given on the command
# line) an expression such as "([0]+[1]*3)*2". Evaluated by walking the AST of list/int literals,
# + and * only: the text is input, never code.
# --------------------------------------------------------------------------------------------

_MAX_PATTERN_LEN = 100_000  # a layer pattern longer than this is not a real model


def _eval_pattern(node: ast.AST) -> int | list[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_eval_pattern(e) for e in node.elts]
        if not all(isinstance(i, int) for i in items):
            raise ValueError("nested list")
        return [i for i in items if isinstance(i, int)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _eval_pattern(node.left), _eval_pattern(node.right)
        if isinstance(node.op, ast.Add):
            if isinstance(left, list) and isinstance(right, list):
                out = left + right
            elif isinstance(left, int) and isinstance(right, int):
                return left + right
            else:
                raise ValueError("list + int")
        else:
            if isinstance(left, list) and isinstance(right, int):
                lst, n = left, right
            elif isinstance(left, int) and isinstance(right, list):
                lst, n = right, left
            elif isinstance(left, int) and isinstance(right, int):
                if abs(left * right) > _MAX_PATTERN_LEN * 1000:
                    raise ValueError("too large")
                return left * right
            else:
                raise ValueError("list * list")
            if n < 0 or len(lst) * n > _MAX_PATTERN_LEN:
                raise ValueError("too long")
            out = lst * n
        if len(out) > _MAX_PATTERN_LEN:
            raise ValueError("too long")
        return out
    raise ValueError(f"not allowed: {type(node).__name__}")


def parse_layer_freq(text: str) -> int | list[int] | None:
    """``1`` -> 1, ``[1, 0, 1]`` -> [1, 0, 1], ``([0]+[1]*3)*2`` -> [0,1,1,1,0,1,1,1]; else None."""
    text = text.strip()
    if not text or text == "None" or len(text) > 10_000:
        return None
    try:
        return _eval_pattern(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


# --------------------------------------------------------------------------------------------
# Arguments -> JobInfo
# --------------------------------------------------------------------------------------------


@dataclass
class StartupFacts:
    """What start-up lines other than the arguments block stated (they survive an args re-apply)."""

    world_sizes: dict[str, int] | None = None
    num_microbatches: int | None = None
    vocab: tuple[int, int] | None = None  # (original, padded)
    virtual_stages: int | None = None
    virtual_stages_seen: bool = False


class _Args:
    """Typed reads of the raw arguments, reporting values that do not convert."""

    def __init__(self, raw: dict[str, str], issue: IssueSink) -> None:
        self.raw = raw
        self.issue = issue

    def get_int(self, name: str) -> int | None:
        text = self.raw.get(name)
        if text is None or text == "None":
            return None
        value = to_int(text)
        if value is None:
            self.issue("argument-not-int", f"{name} {text}")
        return value

    def get_bool(self, name: str) -> bool | None:
        text = self.raw.get(name)
        if text is None or text == "None":
            return None
        if text in ("True", "False"):
            return text == "True"
        self.issue("argument-not-bool", f"{name} {text}")
        return None

    def present(self, name: str) -> bool:
        """Set to something other than None/False (e.g. ``fp8 ... hybrid``)."""
        return self.raw.get(name, "None") not in ("None", "False", "")


def apply_arguments(info: JobInfo, facts: StartupFacts, issue: IssueSink) -> None:
    """Fill ``info.layout`` and ``info.spec`` from ``info.arguments`` and the other start-up facts.

    Idempotent: called whenever the arguments block closes (a restarted job appends a new one).
    Only stated values are written; an argument the log lacks leaves the field as it was.
    """
    a = _Args(info.arguments, issue)
    lay, spec = info.layout, info.spec

    def put_int(obj: object, attr: str, name: str) -> None:
        if name in a.raw:
            setattr(obj, attr, a.get_int(name))

    put_int(lay, "world_size", "world_size")
    put_int(lay, "tp", "model_parallel_size")  # 2019 name of the tensor-parallel size
    put_int(lay, "tp", "tensor_model_parallel_size")
    put_int(lay, "pp", "pipeline_model_parallel_size")
    put_int(lay, "dp", "data_parallel_size")
    put_int(lay, "cp", "context_parallel_size")
    put_int(lay, "ep", "expert_model_parallel_size")
    put_int(lay, "micro_batch_size", "micro_batch_size")
    put_int(lay, "global_batch_size", "global_batch_size")

    put_int(spec, "num_layers", "num_layers")
    put_int(spec, "hidden_size", "hidden_size")
    put_int(spec, "ffn_hidden_size", "ffn_hidden_size")
    put_int(spec, "num_attention_heads", "num_attention_heads")
    put_int(spec, "kv_channels", "kv_channels")
    put_int(spec, "seq_length", "seq_length")
    put_int(spec, "vocab_size", "vocab_size")
    put_int(spec, "padded_vocab_size", "padded_vocab_size")
    put_int(spec, "mtp_num_layers", "mtp_num_layers")
    # Megatron always prints num_query_groups (1 by default); it only means GQA when enabled.
    if a.get_bool("group_query_attention"):
        spec.num_query_groups = a.get_int("num_query_groups")
    elif "group_query_attention" in a.raw:
        spec.num_query_groups = None
    for attr, name in (
        ("swiglu", "swiglu"),
        ("untie_embeddings", "untie_embeddings_and_output_weights"),
        ("multi_latent_attention", "multi_latent_attention"),
    ):
        value = a.get_bool(name)
        if value is not None:
            setattr(spec, attr, value)
    put_int(spec, "num_experts", "num_experts")
    # MoE arguments have defaults that are printed for dense models too (moe_router_topk 2,
    # moe_layer_freq 1): they describe the model only when it has experts.
    if spec.num_experts is not None:
        put_int(spec, "moe_router_topk", "moe_router_topk")
        put_int(spec, "moe_ffn_hidden_size", "moe_ffn_hidden_size")
        put_int(spec, "moe_shared_expert_ffn_hidden_size", "moe_shared_expert_intermediate_size")
        if "moe_layer_freq" in a.raw:
            spec.moe_layer_freq = parse_layer_freq(a.raw["moe_layer_freq"])
            if spec.moe_layer_freq is None and a.raw["moe_layer_freq"] != "None":
                issue("argument-bad-layer-freq", f"moe_layer_freq {a.raw['moe_layer_freq'][:100]}")
    if a.present("fp4"):
        spec.dtype = "fp4"
    elif a.present("fp8"):
        spec.dtype = "fp8"
    elif a.get_bool("bf16"):
        spec.dtype = "bf16"
    elif a.get_bool("fp16"):
        spec.dtype = "fp16"
    elif "bf16" in a.raw or "fp16" in a.raw:
        spec.dtype = "fp32"

    _apply_virtual_stages(a, info)
    if "log_interval" in a.raw:
        info.log_interval = a.get_int("log_interval")
    if a.raw.get("timing_log_option") not in (None, "None"):
        info.timing_log_option = a.raw["timing_log_option"]
    apply_facts(info, facts, issue)


def apply_facts(info: JobInfo, facts: StartupFacts, issue: IssueSink) -> None:
    """Write what the world-size, micro-batch and padded-vocab lines stated (they agree with the
    arguments where both exist; the padded vocab is only known from its own line)."""
    lay, spec = info.layout, info.spec
    if facts.world_sizes:
        ws = facts.world_sizes
        lay.world_size = ws.get("world", lay.world_size)
        lay.dp = ws.get("data-parallel", lay.dp)
        lay.cp = ws.get("context-parallel", lay.cp)
        lay.tp = ws.get("tensor-model-parallel", lay.tp)
        lay.pp = ws.get("pipeline-model-parallel", lay.pp)
        lay.ep = ws.get("expert-model-parallel", lay.ep)
    if facts.num_microbatches is not None:
        lay.num_microbatches = facts.num_microbatches
    if facts.vocab is not None:
        # The padded size is the one the FLOPs formula needs; the arguments block shows
        # padded_vocab_size None because Megatron computes it after printing the block.
        if spec.vocab_size is None:
            spec.vocab_size = facts.vocab[0]
        spec.padded_vocab_size = facts.vocab[1]
    if facts.virtual_stages_seen and lay.vpp is None and facts.virtual_stages and facts.virtual_stages > 1:
        lay.vpp = facts.virtual_stages
    # A size no GPU could hold is corrupt input: it becomes absent, with a counted reason, before
    # any analysis can spend unbounded time on it (perfd.core.bounds).
    for reason in check_job_info(info):
        issue(BOUNDS_REASON, reason)


def _apply_virtual_stages(a: _Args, info: JobInfo) -> None:
    lay, spec = info.layout, info.spec
    vpp = a.get_int("virtual_pipeline_model_parallel_size")
    if vpp is None:
        vpp = a.get_int("num_virtual_stages_per_pipeline_rank")
    if vpp is None:
        # Older logs: only the layers per virtual stage; vpp = layers / pp / layers-per-stage.
        per_stage = a.get_int("num_layers_per_virtual_pipeline_stage")
        if per_stage and spec.num_layers and lay.pp and spec.num_layers % (lay.pp * per_stage) == 0:
            vpp = spec.num_layers // (lay.pp * per_stage)
    # Megatron stores 1 as None ("not interleaved"); keep that convention.
    lay.vpp = vpp if vpp and vpp > 1 else None
