"""What perfd shows of a command line: known-safe options and their values, program and script names,
and nothing else (docs/security.md, "Command lines and stacks").

Why an allow-list: a deny-list names the forms of secrets it knows, and a command line holds the
forms it does not. A review found 22 of 35 forms passing the old one (``PGPASSWORD=``,
``--dbpassword=``, ``--db_pass=``, ``mysql -pX``, ``curl -u u:p``, ``Authorization: Bearer``,
``--wandb-key``, ``glpat-``, ``sk_live_``, ``AIza``, ...). So every word is masked unless it is one
of these:

- a program: the first word, and each word naming a known interpreter or launcher (``python3``,
  ``torchrun``, ``deepspeed``, ``nsys``, ...) with the script it runs (a path ending ``.py``, ``.sh``,
  ...), the module of ``python -m``, and a launcher's subcommand (``accelerate launch``);
- a file name with a script or configuration suffix (``train.py``, ``cfg.yaml``);
- an option in :data:`SAFE_OPTIONS` (the training, launcher and serving options perfd's users run
  with: ``--num-layers``, ``--nproc_per_node``, ``--model-path``, ...), with its value; the name
  compared in lower case, ``_`` as ``-``, and for a dotted name (``--training.steps``) also its last
  part. A name with a secret word among its parts (``pass``, ``token``, ``key``, ...) is never safe;
- the name of any other option, of a ``KEY=VALUE`` word, and a ``-x`` short option's letter: the name
  stays, the value goes (``--db-pass=<redacted>``, ``PGPASSWORD=<redacted>``, ``-p<redacted>``); what
  follows an option's name that is not part of a name goes too (``--token:<redacted>``).

Words are split at any whitespace or invisible character, not only at spaces (:data:`SEPARATOR`). Every
word kept is also scanned for what is a secret wherever it is, by its shape (perfd.core.secret_shapes: a
URL's query values and user information, a webhook's path, ``user:pw@host``, a pair with a secret's
name, the token formats of major providers), as is a whole text by :func:`redact_text` (py-spy's
output, whose first line is the command line: :func:`redact_stack`).
"""

from __future__ import annotations

import re

from perfd.core.secret_shapes import REDACTED as REDACTED
from perfd.core.secret_shapes import SECRET_PARTS as SECRET_PARTS
from perfd.core.secret_shapes import scrub as scrub

# What separates a command line's words: any whitespace (tabs, newlines, \x0b, \x0c, \r, unicode
# spaces), a control character, and the invisible format characters (zero-width spaces, bidi marks). A
# word holding one is two words to a reader, and kept whole it would carry a second word past the
# allow-list (``--bf16\t--token\tSECRET``, a safe value ``3e-4\n--api-key=SECRET``).
SEPARATOR = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")

# Interpreters and launchers: the word after their own options is the program or script they run.
_LAUNCHERS = re.compile(r"^(?:python[0-9.]*|pypy[0-9.]*|torchrun|deepspeed|accelerate|bash|sh|env|srun|"
                        r"mpirun|mpiexec|numactl|taskset|nsys|ncu|perfd|uv|poetry|conda|nohup|time|"
                        r"sglang|vllm|composer|lightning)$")
_SUBCOMMANDS = frozenset({"launch", "run", "serve", "train", "fit", "eval", "evaluate", "validate", "test",
                          "predict", "profile", "exec", "agent", "aggregator", "ncu-exec"})
_SCRIPT = re.compile(r"^[\w@%+,./-]*[\w-]\.(?:py|sh|bash|yaml|yml|json|toml|cfg|ini|conf|txt)$")
_MODULE = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*$")
# Python's own short options that take no secret: -u -O -B -E -s -S -I -b -q -v -W, -X (its value).
_PY_SHORT = frozenset("uOBEsSIbqvWXdPR")

# Options whose value perfd shows (compared as lower case, "_" as "-", leading dashes off).
SAFE_OPTIONS: frozenset[str] = frozenset("""
help version verbose quiet debug log-level loglevel seed device devices gpus num-gpus nodes world-size rank
local-rank node-rank backend dist-backend distributed-backend name run-name exp-name experiment-name project
job job-name config config-file config-name config-path cfg output output-dir out-dir log-dir logdir
logging-dir save load save-dir checkpoint-dir resume resume-from-checkpoint data-path data-dir dataset
dataset-name dataset-config-name train-data valid-data test-data split tokenizer tokenizer-type
tokenizer-model tokenizer-name tokenizer-path vocab-file merge-file vocab-size
make-vocab-size-divisible-by batch-size micro-batch-size global-batch-size rampup-batch-size epochs
num-train-epochs steps max-steps train-iters train-samples eval-iters eval-interval eval-steps
log-interval logging-steps save-interval save-steps exit-interval exit-duration-in-mins lr learning-rate
min-lr lr-decay-style lr-decay-iters lr-decay-samples lr-warmup-iters lr-warmup-fraction lr-warmup-samples
lr-scheduler-type warmup-steps warmup-ratio weight-decay clip-grad max-grad-norm adam-beta1 adam-beta2
adam-eps optimizer optim init-method-std hidden-dropout attention-dropout dropout num-layers hidden-size
ffn-hidden-size num-attention-heads num-query-groups group-query-attention kv-channels seq-length
max-seq-length seq-len block-size max-position-embeddings position-embedding-type rotary-base
rotary-percent use-rotary-position-embeddings norm-epsilon normalization swiglu
untie-embeddings-and-output-weights disable-bias-linear transformer-impl use-mcore-models use-flash-attn
attention-backend tensor-model-parallel-size pipeline-model-parallel-size context-parallel-size
expert-model-parallel-size expert-tensor-parallel-size virtual-pipeline-model-parallel-size
num-layers-per-virtual-pipeline-stage sequence-parallel use-distributed-optimizer overlap-grad-reduce
overlap-param-gather bf16 fp16 fp32 fp8-format fp8-margin fp8-amax-history-len fp8-amax-compute-algo
mixed-precision precision dtype recompute-granularity recompute-method recompute-num-layers
distributed-timeout-minutes num-workers dataloader-type dataloader-num-workers log-throughput
timing-log-level timing-log-option tensorboard-dir log-timers-to-tensorboard wandb-project wandb-exp-name
wandb-save-dir wandb-entity wandb-run-id manual-gc manual-gc-interval num-experts moe-router-topk
moe-grouped-gemm moe-aux-loss-coeff mock-data ckpt-format no-load-optim
no-load-rng finetune accumulate-allreduce-grads-in-fp32 no-masked-softmax-fusion no-bias-gelu-fusion
no-bias-dropout-fusion no-gradient-accumulation-fusion use-checkpoint-args tp pp dp cp ep tp-size
dp-size pp-size nproc-per-node nnodes master-addr master-port rdzv-backend rdzv-endpoint rdzv-id
standalone max-restarts monitor-interval start-method role run-path no-python module tee redirects
local-addr num-processes num-machines machine-rank main-process-ip main-process-port multi-gpu
dynamo-backend use-deepspeed deepspeed deepspeed-config-file zero-stage fsdp fsdp-config
gradient-accumulation-steps gradient-checkpointing torch-compile per-device-train-batch-size
per-device-eval-batch-size model model-name model-name-or-path model-path model-type served-model-name
do-train do-eval overwrite-output-dir report-to port host mem-fraction-static max-running-requests
context-length kv-cache-dtype quantization chunked-prefill-size max-prefill-tokens schedule-policy
trust-remote-code enable-metrics tensor-parallel-size pipeline-parallel-size data-parallel-size
gpu-memory-utilization max-model-len max-num-seqs enforce-eager disable-log-stats job-user
agent-socket kineto flight-recorder fr-timing fr-buffer nsys-trace ncu-ranks interval-s
""".split())
# Environment-style names (KEY=VALUE) whose value perfd shows.
SAFE_VARIABLES: frozenset[str] = frozenset("""
cuda-visible-devices omp-num-threads nccl-debug nccl-debug-subsys nccl-ib-disable nccl-p2p-disable
nccl-socket-ifname master-addr master-port world-size rank local-rank local-world-size node-rank
pythonunbuffered pythonpath torch-distributed-debug torch-nccl-async-error-handling
cuda-device-max-connections kineto-use-daemon perfd-job perfd-hook-socket
""".split())


def _norm(name: str) -> str:
    return name.lstrip("-").lower().replace("_", "-")


def _safe(name: str, allowed: frozenset[str]) -> bool:
    n = _norm(name)
    if not n or any(part in SECRET_PARTS for part in re.split(r"[-.]", n)):
        return False
    return n in allowed or ("." in n and n.rsplit(".", 1)[1] in allowed)


def redact_cmdline(cmd: str) -> str:
    """``cmd`` (words separated by spaces, as perfd reads ``/proc/PID/cmdline``) with every value masked
    that is not known to be safe (see the module); words split at any :data:`SEPARATOR`, shown
    separated by one space each."""
    return " ".join(_Words().redact(SEPARATOR.split(cmd)))


_NUMBER = re.compile(r"^-?[0-9][0-9.eE+-]*$")
_ASSIGNMENT = re.compile(r"^[\w.-]+=")
_WORD = re.compile(r"^[\w@%+,./-]+$")
# An option's name, and a ":" after it: what follows without an "=" is a value ("--token:SECRET", as
# .NET-style tools take it).
_OPTION_NAME = re.compile(r"^--[\w.-]*:?")


class _Words:
    """One pass over a command line's words (see the module)."""

    def __init__(self) -> None:
        self.first = True  # the next positional word is the command's program
        self.after_launcher = False  # ... or what a launcher runs (its script, module, subcommand)
        self.python = False  # within a Python interpreter's own options (before its script)
        self.pending: str | None = None  # an option's value is the next word: "safe", "mask", "module"

    def redact(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for w in words:
            if not w:
                out.append(w)
            elif self.pending is not None and (not w.startswith("-") or _NUMBER.match(w)):
                out.append(self._value(w))
            else:
                self.pending = None
                out.append(self._word(w))
                if self.first and not _ASSIGNMENT.match(w):
                    self.first = False  # the program is the first word (after KEY=VALUE ones), or none
        return out

    def _value(self, w: str) -> str:
        kind, self.pending = self.pending, None
        if kind == "module" and _MODULE.match(w):
            self._ran(w)
            return w
        return scrub(w) if kind == "safe" else REDACTED

    def _ran(self, program: str) -> None:
        """``program`` is what runs now: a launcher runs the next positional word in turn."""
        base = program.rsplit("/", 1)[-1]
        launcher = bool(_LAUNCHERS.match(base))
        self.first = False
        self.after_launcher = launcher
        self.python = launcher and base.startswith(("python", "pypy"))

    def _word(self, w: str) -> str:
        if w == "--":  # what follows is another command (perfd launch -- CMD, torchrun --no-python)
            self.first, self.after_launcher, self.python = True, False, False
            return w
        if w.startswith("--"):
            name, eq, value = w.partition("=")
            safe = _safe(name, SAFE_OPTIONS)
            bare = _OPTION_NAME.match(name)
            if not eq and bare is not None and bare.end() < len(name):
                return bare[0] + REDACTED
            if eq:
                return f"{name}={scrub(value) if safe else (REDACTED if value else '')}"
            self.pending = "safe" if safe else "mask"
            return name
        if w.startswith("-") and len(w) > 1 and not _NUMBER.match(w):
            return self._short(w)
        key, eq, value = w.partition("=")
        if eq and _ASSIGNMENT.match(w):
            return f"{key}={scrub(value) if _safe(key, SAFE_OPTIONS | SAFE_VARIABLES) else REDACTED}"
        base = w.rsplit("/", 1)[-1]
        if _WORD.match(w) and (self.first or _LAUNCHERS.match(base)
                               or (self.after_launcher and ("/" in w or _SCRIPT.match(w)
                                                           or base in _SUBCOMMANDS))):
            self._ran(w)
            return scrub(w)
        if _SCRIPT.match(w):
            return scrub(w)
        return REDACTED

    def _short(self, w: str) -> str:
        letter, rest = w[1], w[2:]
        if self.python and letter == "m":
            if rest:
                self._ran(rest)
                return w if _MODULE.match(rest) else "-m" + REDACTED
            self.pending = "module"
            return w
        if self.python and letter in _PY_SHORT and (not rest or letter in "WX"):
            if letter in "WX" and not rest:
                self.pending = "safe"
            return scrub(w)
        self.pending = None if rest else "mask"
        return f"-{letter}{REDACTED if rest else ''}"


def redact_text(text: str) -> str:
    """Any text perfd passes on from a process (what py-spy printed): secret formats masked."""
    return scrub(text)


_PROCESS_LINE = re.compile(r"^Process \d+: ", re.MULTILINE)
# py-spy's line after the command line. The command line runs to the last one: a word of it may hold a
# newline (py-spy prints the words as they are), and what follows that newline is still the command line.
_INTERPRETER_LINE = re.compile(r"^Python v[0-9][^\n]*$", re.MULTILINE)


def redact_stack(text: str) -> str:
    """py-spy's dump: the command line after its ``Process N:`` redacted as :func:`redact_cmdline`
    does, and secret formats masked anywhere (a thread's name, a path)."""
    m = _PROCESS_LINE.search(text)
    if m is not None:
        ends = [i.start() for i in _INTERPRETER_LINE.finditer(text, m.end())]
        end = ends[-1] - 1 if ends else len(text)  # before the newline that ends it; no such line: all
        text = text[:m.end()] + redact_cmdline(text[m.end():end]) + text[end:]
    return redact_text(text)
