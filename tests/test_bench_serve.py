"""`benchmarks/bench_serve.py` without a server: parsing what vLLM 0.32's clients and server write (samples copied from
one real run, trimmed), the prompt files read back by vLLM's own ShareGPT loader, the commands, and the summary's
medians, ratios and table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import bench_serve as bs

MODEL = "/root/.cache/vllm-lookahead/models/smollm2-135m-instruct"

# `vllm bench serve --save-result` (vLLM 0.32) of lookahead on the random dataset, concurrency 1, 2 prompts of 16
# tokens (float32), per-position rates cut to 10 entries.
SERVE_RESULT_LOOKAHEAD = json.loads(
    """{"date": "20261128-061951", "endpoint_type": "openai", "backend": "openai", "label": "lookahead",
"model_id": "/root/.cache/vllm-lookahead/models/smollm2-135m-instruct",
"tokenizer_id": "/root/.cache/vllm-lookahead/models/smollm2-135m-instruct", "num_prompts": 2, "request_rate": "inf",
"burstiness": 1.0, "max_concurrency": 1, "duration": 0.7010648689997652, "completed": 2, "failed": 0,
"total_input_tokens": 256, "total_output_tokens": 32, "request_throughput": 2.8528030549490704,
"request_goodput": null, "output_throughput": 45.644848879185126, "total_token_throughput": 410.80363991266614,
"latencies": [0.3677981060000093, 0.3329753759999221], "queue_times": [7.495299996662652e-05, 0.36795534200018665],
"max_output_tokens_per_s": 16.0, "max_concurrent_requests": 2, "rtfx": 0.0, "spec_decode_acceptance_rate": 100.0,
"spec_decode_acceptance_length": 5.6, "spec_decode_num_drafts": 5, "spec_decode_draft_tokens": 23,
"spec_decode_accepted_tokens": 23,
"spec_decode_per_position_acceptance_rates": [1.0, 1.0, 1.0, 0.6, 0.4, 0.2, 0.2, 0.2, 0.0, 0.0],
"mean_ttft_ms": 126.00116199996592, "median_ttft_ms": 126.00116199996592, "std_ttft_ms": 12.82510199985154,
"p50_ttft_ms": 126.00116199996592, "p99_ttft_ms": 138.56976195982043, "mean_tpot_ms": 14.959038599999985,
"median_tpot_ms": 14.959038599999985, "std_tpot_ms": 0.30575086667947, "p50_tpot_ms": 14.959038599999985,
"p99_tpot_ms": 15.258674449345866, "mean_itl_ms": 32.05508271428568, "median_itl_ms": 30.874505500150917,
"std_itl_ms": 6.274118877090582, "p50_itl_ms": 30.874505500150917, "p99_itl_ms": 41.99231834991224,
"mean_e2el_ms": 350.3867409999657, "median_e2el_ms": 350.3867409999657, "std_e2el_ms": 17.41136500004359,
"p50_e2el_ms": 350.3867409999657, "p99_e2el_ms": 367.4498787000084}"""
)
# The same for plain decoding on the code dataset: no spec_decode_* keys at all.
SERVE_RESULT_NONE = json.loads(
    """{"date": "20261128-061831", "endpoint_type": "openai", "backend": "openai", "label": "none",
"model_id": "/root/.cache/vllm-lookahead/models/smollm2-135m-instruct", "num_prompts": 2, "request_rate": "inf",
"burstiness": 1.0, "max_concurrency": 1, "duration": 0.8284849659999054, "completed": 2, "failed": 0,
"total_input_tokens": 243, "total_output_tokens": 32, "request_throughput": 2.41404501237531,
"request_goodput": null, "output_throughput": 38.62472019800496, "total_token_throughput": 331.93118920160515,
"mean_ttft_ms": 86.85076199981268, "median_ttft_ms": 86.85076199981268, "std_ttft_ms": 0.9727299998303351,
"p50_ttft_ms": 86.85076199981268, "p99_ttft_ms": 87.8040373996464, "mean_tpot_ms": 21.816410166669204,
"median_tpot_ms": 21.816410166669204, "p50_tpot_ms": 21.816410166669204, "p99_tpot_ms": 21.881372243323916,
"mean_itl_ms": 21.816410166669204, "median_itl_ms": 21.70073749994117, "std_itl_ms": 0.8156956967332281,
"p50_itl_ms": 21.70073749994117, "p99_itl_ms": 24.437978700179887, "mean_e2el_ms": 414.09691449985075,
"p99_e2el_ms": 414.11807024983773}"""
)

_LABELS = '{engine="0",model_name="/root/.cache/vllm-lookahead/models/smollm2-135m-instruct"}'
_POS = '{engine="0",model_name="/root/.cache/vllm-lookahead/models/smollm2-135m-instruct",position="%d"}'


def _metrics_text(generated: float, drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]) -> str:
    """A lookahead server's /metrics as vLLM 0.32 writes it (lines copied from a real scrape, trimmed; the counts are
    parameters so that a before/after pair can be built)."""
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{_LABELS} 0.0",
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{_LABELS} {drafts}",
        "# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_created gauge",
        f"vllm:spec_decode_num_drafts_created{_LABELS} 1.7958467781000292e+09",
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{_LABELS} {draft_tokens}",
        "# HELP vllm:spec_decode_num_draft_tokens_created Number of draft tokens.",
        "# TYPE vllm:spec_decode_num_draft_tokens_created gauge",
        f"vllm:spec_decode_num_draft_tokens_created{_LABELS} 1.795846778100051e+09",
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{_LABELS} {accepted}",
        "# HELP vllm:spec_decode_num_accepted_tokens_created Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_created gauge",
        f"vllm:spec_decode_num_accepted_tokens_created{_LABELS} 1.7958467781000652e+09",
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{_POS % i} {v}" for i, v in enumerate(per_pos)],
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{_LABELS} {generated}",
        "# HELP vllm:generation_tokens_created Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_created gauge",
        f"vllm:generation_tokens_created{_LABELS} 1.7958467781005957e+09",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="/m"} 8.0',
    ]
    return "\n".join(lines) + "\n"


# The real final scrape of the lookahead server (counts as scraped) and an earlier one (counts before the last run).
METRICS_AFTER = _metrics_text(192.0, 25.0, 215.0, 154.0, [16.0, 15.0, 13.0])
METRICS_BEFORE = _metrics_text(160.0, 13.0, 163.0, 149.0, [12.0, 12.0, 11.0])
# Plain decoding's server has no spec_decode lines.
METRICS_NONE = "\n".join(
    [
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{_LABELS} 192.0",
    ]
)

# `vllm bench throughput --output-json` (lookahead, random, 2 prompts of 16 tokens) and its last printed lines.
THROUGHPUT_RESULT = {
    "model_id": MODEL,
    "elapsed_time": 2.3867233959999794,
    "num_requests": 2,
    "total_num_tokens": 288,
    "requests_per_second": 0.8379689089032658,
    "tokens_per_second": 120.66752288207027,
}
THROUGHPUT_LOG = (
    "(EngineCore pid=17364) INFO 11-28 06:24:56 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM\n"
    "Throughput: 0.84 requests/s, 120.67 total tokens/s, 13.41 output tokens/s\n"
    "Total num prompt tokens:  256\n"
    "Total num output tokens:  32\n"
)


def test_serve_result_parsed():
    row = bs.parse_serve_result(SERVE_RESULT_LOOKAHEAD)
    assert row["output_tps"] == pytest.approx(45.6448, abs=1e-3)
    assert row["ttft_mean_ms"] == pytest.approx(126.001, abs=1e-3)
    assert row["ttft_p99_ms"] == pytest.approx(138.570, abs=1e-3)
    assert row["itl_mean_ms"] == pytest.approx(32.055, abs=1e-3)
    assert row["itl_p99_ms"] == pytest.approx(41.992, abs=1e-3)
    assert row["tpot_p50_ms"] == pytest.approx(14.959, abs=1e-3)
    assert row["completed"] == 2 and row["failed"] == 0 and row["output_tokens"] == 32
    assert row["acceptance_rate"] == 100.0 and row["acceptance_length"] == 5.6 and row["client_accepted_tokens"] == 23
    assert "tokens_per_forward" not in row  # only from the server's counters

    plain = bs.parse_serve_result(SERVE_RESULT_NONE)
    assert plain["output_tps"] == pytest.approx(38.6247, abs=1e-3)
    assert "acceptance_rate" not in plain


def test_first_wave_and_later_ttft_parsed():
    """With `--save-detailed`, the mean TTFT of the requests sent at the start (as many as the concurrency) apart
    from the later ones, by start time whatever order vLLM lists them in; no split without the detailed fields."""
    detailed = {**SERVE_RESULT_NONE, "max_concurrency": 2, "num_prompts": 5,
                "start_times": [10.0, 10.0, 11.5, 10.9, 12.0], "ttfts": [0.9, 1.1, 0.3, 0.1, 0.2]}  # fmt: skip
    row = bs.parse_serve_result(detailed)
    assert row["ttft_first_wave_ms"] == pytest.approx(1000.0) and row["ttft_later_ms"] == pytest.approx(200.0)
    one_wave = bs.parse_serve_result({**detailed, "max_concurrency": 8})
    assert one_wave["ttft_first_wave_ms"] == pytest.approx(520.0) and "ttft_later_ms" not in one_wave
    assert "ttft_first_wave_ms" not in bs.parse_serve_result(SERVE_RESULT_NONE)


def test_metrics_parsed_and_differenced():
    after = bs.parse_metrics(METRICS_AFTER)
    assert after[bs.GENERATION] == 192.0 and after[bs.ACCEPTED] == 154.0
    assert after[bs.DRAFTS] == 25.0 and after[bs.DRAFT_TOKENS] == 215.0
    assert after["accepted_per_pos"] == {0: 16.0, 1: 15.0, 2: 13.0}  # not mixed into the accepted total
    delta = bs.metrics_delta(bs.parse_metrics(METRICS_BEFORE), after)
    assert delta[bs.GENERATION] == 32.0 and delta[bs.ACCEPTED] == 5.0 and delta[bs.DRAFTS] == 12.0
    assert delta["accepted_per_pos"] == [4.0, 3.0, 2.0]
    row = bs.parse_serve_result(SERVE_RESULT_NONE, delta)
    assert row["tokens_per_forward"] == pytest.approx(32 / 27)
    assert row["accepted_tokens"] == 5.0 and row["server_generated_tokens"] == 32.0

    # plain decoding: no spec_decode lines, so nothing accepted and one token per forward
    none = bs.parse_metrics(METRICS_NONE)
    assert none[bs.ACCEPTED] == 0.0 and none["accepted_per_pos"] == {}
    delta = bs.metrics_delta(none, {**none, bs.GENERATION: 224.0})
    assert bs.parse_serve_result(SERVE_RESULT_NONE, delta)["tokens_per_forward"] == 1.0


def test_metrics_summed_over_engines():
    # data parallelism: one sample per engine under the same family; the counts are their sum
    two = METRICS_NONE + '\nvllm:generation_tokens_total{engine="1",model_name="m"} 8.0\n'
    assert bs.parse_metrics(two)[bs.GENERATION] == 200.0


def test_tokens_per_forward():
    assert bs.tokens_per_forward(32, 23) == pytest.approx(32 / 9)
    assert bs.tokens_per_forward(100, 0) == 1.0
    assert bs.tokens_per_forward(0, 0) is None


def test_throughput_result_parsed():
    row = bs.parse_throughput_result(THROUGHPUT_RESULT, THROUGHPUT_LOG, output_len=16)
    assert row["output_tokens"] == 32 and row["output_tokens_source"] == "counted by vllm bench throughput"
    assert row["output_tps"] == pytest.approx(32 / 2.3867233959999794)
    assert row["total_tps"] == pytest.approx(120.6675, abs=1e-3) and row["completed"] == 2
    # without the printed count: requests x output length (it always ignores EOS)
    row = bs.parse_throughput_result(THROUGHPUT_RESULT, "", output_len=16)
    assert row["output_tokens"] == 32 and row["output_tokens_source"] == "requests x output length"


def test_prompt_counts_and_slices():
    assert [bs.num_prompts_for(c, 8, 128, 2) for c in (1, 4, 16, 64, 100)] == [8, 8, 32, 128, 128]
    assert [bs.num_prompts_for(c, 16, 256, 4) for c in (1, 4, 16, 64)] == [16, 16, 64, 256]
    counts = bs.prompt_counts([1, 4, 16, 64], 8, 128, 2)
    assert counts == {1: 8, 4: 8, 16: 32, 64: 128}
    assert bs.prompt_slices(counts) == {1: (0, 8), 4: (8, 8), 16: (16, 32), 64: (48, 128)}
    # HumanEval's 164 for 16 + 16 + 64 + 256 wanted: the largest level gives up prompts first, down to one a slot,
    # then the next
    assert bs.prompt_counts([1, 4, 16, 64], 16, 256, 4, available=164) == {1: 16, 4: 16, 16: 64, 64: 68}
    assert bs.prompt_counts([1, 4, 16, 64], 16, 256, 4, available=120) == {1: 16, 4: 16, 16: 24, 64: 64}
    # fewer than one a slot at every level: nothing below one a slot (the prompts then wrap around)
    assert bs.prompt_counts([1, 4, 16, 64], 16, 256, 4, available=50) == {1: 1, 4: 4, 16: 16, 64: 64}
    assert bs.prompt_counts([1, 4, 16, 64], 16, 256, 4, available=10_000) == {1: 16, 4: 16, 16: 64, 64: 256}
    assert bs.max_model_len_for(500, 128) == 704 and bs.max_model_len_for(128, 16) == 256


def test_levels_never_repeat_a_prompt_where_the_set_is_short(tmp_path):
    """HumanEval's 164 prompts for 16 + 16 + 64 + 256 wanted: the 64-request run sends what is left, and no prompt goes
    to two levels of one server (a suffix cache would meet its answer again)."""

    class Tok:  # one token per word
        def __call__(self, text):
            return type("Enc", (), {"input_ids": text.split()})()

    args = bs.parse_args(["--datasets", "random,code", "--out", str(tmp_path)])
    files, _, notes = bs.write_datasets(args, Tok(), tmp_path)
    counts = files["counts"]
    assert counts["random"] == {1: 16, 4: 16, 16: 64, 64: 256}
    code = counts["code"]
    assert code[1] == 16 and code[4] == 16 and code[16] == 64 and 64 <= code[64] <= 164 - 96
    sent = [rec["conversations"][0]["value"] for c in code for rec in json.loads(files["code"]["serve"][c].read_text())]
    assert len(sent) == sum(code.values()) == len(set(sent))
    assert any(n.startswith("code:") and f"{code[64]} at 64" in n for n in notes) and "reused" not in " ".join(notes)


def test_sharegpt_file_read_by_vllm(tmp_path):
    """The prompt file as vLLM's own ShareGPT loader reads it (what `vllm bench serve/throughput` do with it)."""
    from vllm.benchmarks.datasets.datasets import ShareGPTDataset, is_valid_sequence

    class Tok:  # one token per word: enough for the loader's length checks
        def __call__(self, text):
            return type("Enc", (), {"input_ids": text.split()})()

    prompts = [f"<|im_start|>user\nquestion {i} with some words<|im_end|>\n<|im_start|>assistant\n" for i in range(5)]
    path = bs.write_sharegpt_file(tmp_path / "chat.json", prompts)
    data = ShareGPTDataset(dataset_path=str(path), disable_shuffle=True, random_seed=0)
    reqs = data.sample(tokenizer=Tok(), num_requests=5, output_len=16, no_oversample=True)
    assert [r.prompt for r in reqs] == prompts  # in order, no template added, nothing dropped
    assert all(r.expected_output_len == 16 for r in reqs)
    # the files hold only prompts the loader keeps: same bounds as its is_valid_sequence
    for n, out in [(3, 16), (4, 16), (1024, 16), (1025, 16), (2000, 100), (1000, 1048), (1000, 1049)]:
        assert bs.loadable(n, out) == is_valid_sequence(n, out, skip_min_output_len_check=True), (n, out)


def test_client_and_offline_commands(tmp_path):
    args = bs.parse_args(["--datasets", "random,code", "--concurrency", "4,1", "--out", str(tmp_path)])
    assert args.concurrency_list == [1, 4]
    files = {"code": {"serve": {1: tmp_path / "code_c1.json", 4: tmp_path / "code_c4.json"}, "offline": "o.json"}}
    cmd = bs.serve_client_command(args, 8000, MODEL, "code", 4, 8, files)
    text = " ".join(cmd)
    assert "bench serve" in text and "--max-concurrency 4" in text and "--num-prompts 8" in text
    assert "--temperature 0" in text and "--request-rate inf" in text and "--metric-percentiles 50,99" in text
    assert "--ready-check-timeout-sec 0" in text  # no untimed first request that the timed run would repeat
    assert "--save-detailed" in text  # per-request TTFTs: the first wave apart from the later requests
    assert f"--dataset-name sharegpt --dataset-path {tmp_path / 'code_c4.json'}" in text
    assert "--sharegpt-output-len 128" in text and "--disable-shuffle" in text and "--ignore-eos" not in text
    rnd = " ".join(bs.serve_client_command(args, 8000, MODEL, "random", 4, 8, files))
    assert "--random-input-len 128 --random-output-len 128 --seed 1" in rnd  # seed per concurrency level
    off = " ".join(bs.throughput_command(args, "lookahead", MODEL, "code", 512, files, tmp_path / "t.json"))
    assert "cpu_runtime run --" in off and "bench throughput" in off
    assert '--speculative-config {"method": "lookahead"}' in off and "--dataset-path o.json --output-len 128" in off
    assert "--max-num-seqs 4" in off and "--max-num-batched-tokens 2048" in off and "--num-prompts 16" in off
    plain = bs.throughput_command(args, "none", MODEL, "random", 512, files, tmp_path / "t.json")
    assert "--speculative-config" not in plain


def test_offline_run_alone_records_vllm_s_result(tmp_path, monkeypatch):
    """With --no-serve the offline run is the sweep's first: its result's folder is there for vLLM's client, and
    the result is parsed into an ok record."""
    args = bs.parse_args(["--methods", "lookahead", "--datasets", "random", "--no-serve", "--out", str(tmp_path)])
    sweep = bs.Sweep(args)

    def client(cmd, log, env, timeout):
        out = Path(cmd[cmd.index("--output-json") + 1])
        result = {"elapsed_time": 8.0, "num_requests": 16, "tokens_per_second": 512.0, "requests_per_second": 2.0}
        out.write_text(json.dumps(result))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("Total num output tokens:  2048\n")
        return 0

    monkeypatch.setattr(bs, "run_to_end", client)
    sweep.offline_run(0, "lookahead", "random", MODEL, 512, {})
    [record] = sweep.records
    assert record["status"] == "ok", record.get("error")
    assert record["kind"] == "offline" and record["output_tps"] == pytest.approx(256.0)


def test_server_command(tmp_path):
    args = bs.parse_args(["--methods", "ngram", "--dtype", "bfloat16", "--lookahead-config", '{"x": 1}'])
    server = bs.Server("ngram", args, MODEL, 704, tmp_path / "server.log")
    server.port = 1234
    cmd = server.command()
    text = " ".join(cmd)
    assert cmd[1:5] == ["-m", "vllm_lookahead.tools.cpu_runtime", "run", "--"]
    assert f"serve {MODEL} --host 127.0.0.1 --port 1234 --dtype bfloat16 --max-model-len 704" in text
    assert "--max-num-seqs 64" in text and "--enforce-eager" not in text
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == bs.METHODS["ngram"]
    assert bs.speculative_config("lookahead", args) == {"method": "lookahead", "x": 1}
    assert bs.speculative_config("none", args) is None
    assert args.out.endswith("serve/bfloat16")


def test_method_variants_carry_their_options():
    args = bs.parse_args(["--methods", "none-sync,lookahead-reference", "--lookahead-config", '{"x": 1}'])
    assert bs.engine_flags("none-sync") == ["--no-async-scheduling"] and bs.engine_flags("lookahead") == []
    assert bs.engine_env(args, "lookahead-reference")["VLLM_LOOKAHEAD_TREE_KERNEL"] == "0"
    assert bs.engine_env(args, "none")["VLLM_LOOKAHEAD_FIX_CPU_SAMPLING"] == "1"
    assert bs.speculative_config("lookahead-reference", args) == {"method": "lookahead", "x": 1}
    server = bs.Server("none-sync", args, MODEL, 256, Path("server.log"))
    assert "--no-async-scheduling" in server.command() and "--speculative-config" not in server.command()


def test_bad_args_refused():
    bad = (["--methods", "eagle"], ["--datasets", "mmlu"], ["--concurrency", "0"], ["--lookahead-config", "[1]"])
    for argv in (*bad, ["--no-serve", "--no-offline"]):
        with pytest.raises(SystemExit):
            bs.parse_args(argv)


def _records() -> list[dict]:
    """3 rounds of none / lookahead on one dataset at concurrency 4, one failed lookahead round."""
    recs = []
    for rnd, (none_tps, la_tps) in enumerate([(100.0, 150.0), (80.0, 100.0), (120.0, None)]):
        recs.append(
            {"kind": "serve", "round": rnd, "method": "none", "dataset": "code", "concurrency": 4, "status": "ok",
             "output_tps": none_tps, "ttft_mean_ms": 50.0 + rnd, "ttft_p99_ms": 60.0, "itl_mean_ms": 20.0,
             "itl_p99_ms": 30.0, "tokens_per_forward": 1.0, "ttft_later_ms": 20.0}
        )  # fmt: skip
        if la_tps is None:
            recs.append(
                {"kind": "serve", "round": rnd, "method": "lookahead", "dataset": "code", "concurrency": 4,
                 "status": "server-failed", "error": "vllm serve (lookahead) exited with code 1"}
            )  # fmt: skip
        else:
            recs.append(
                {"kind": "serve", "round": rnd, "method": "lookahead", "dataset": "code", "concurrency": 4,
                 "status": "ok", "output_tps": la_tps, "ttft_mean_ms": 70.0, "ttft_p99_ms": 90.0, "itl_mean_ms": 40.0,
                 "itl_p99_ms": 60.0, "tokens_per_forward": 2.0 + rnd, "acceptance_rate": 50.0,
                 "ttft_later_ms": 19.0 + 2 * rnd}
            )  # fmt: skip
    recs.append(
        {"kind": "offline", "round": 0, "method": "lookahead", "dataset": "code", "concurrency": 4, "status": "ok",
         "output_tps": 90.0}
    )  # fmt: skip
    return recs


def test_summary_medians_and_ratios():
    rows = bs.summarize(_records(), ["none", "lookahead"])
    assert [(r["kind"], r["method"]) for r in rows] == [
        ("serve", "none"),
        ("serve", "lookahead"),
        ("offline", "lookahead"),
    ]
    none, la, off = rows
    assert none["output_tps"] == {"median": 100.0, "min": 80.0, "max": 120.0, "n": 3}
    assert none["ratio"]["median"] == 1.0 and none["ttft_mean_ms"]["median"] == 51.0
    # ratios per round (1.5, 1.25), median of the two; the failed round counted, not used
    assert la["ratio"] == {"median": pytest.approx(1.375), "min": 1.25, "max": 1.5, "n": 2}
    assert la["output_tps"]["median"] == 125.0 and la["tokens_per_forward"]["median"] == 2.5
    assert la["rounds"] == 2 and la["failed_rounds"] == 1 and "exited with code 1" in la["errors"][0]
    assert off["ratio"] is None and off["ttft_mean_ms"] is None  # no offline plain decoding to compare with
    assert bs.spread([None, float("nan")]) is None


def test_table_and_plot(tmp_path):
    rows = bs.summarize(_records(), ["none", "lookahead"])
    table = bs.format_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("| run | dataset | method | conc | tok/s | vs none |") and len(lines) == 5
    assert "| serve | code | lookahead | 4 | 125.0 (100.0-150.0) | 1.38 (1.25-1.50) | 70 (70-70) / 90 |" in table
    assert "2.50 (2.00-3.00) | 2 (1 failed) |" in table
    assert "| offline | code | lookahead | 4 | 90.0 | - | - | - | - | 1 |" in table
    png = tmp_path / "plot.png"
    bs.plot(rows, ["code"], ["none", "lookahead"], png, "test")
    assert png.stat().st_size > 1000
    # four panel rows: tokens/s, mean TTFT, TTFT after the first wave (the records carry it), offline tokens/s
    assert int.from_bytes(png.read_bytes()[20:24], "big") == round(4 * 3.75 * 120)
    # a `--no-serve` run: the offline runs alone, as bars (no empty serve panels)
    offline = [r for r in rows if r["kind"] == "offline"]
    bs.plot(offline, ["code"], ["none", "lookahead"], tmp_path / "offline.png", "test")
    assert (tmp_path / "offline.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no runs"):
        bs.plot([], ["code"], ["none"], tmp_path / "none.png", "test")


def test_progress_line():
    ok = {**_records()[1], "completed": 8}
    assert "lookahead" in bs.progress(ok, 3, 12.0) and "150.0 tok/s" in bs.progress(ok, 3, 12.0)
    failed = _records()[5]
    assert "SERVER-FAILED" in bs.progress(failed, 3, 1.0)


def test_lookahead_stats_differenced_per_run(monkeypatch):
    """A run's lookahead record: the counters' change over the run, the step prices as they stand after it; the
    progress line shows the drafts per step and the prices."""
    before = {"steps": 100, "tree_steps": 90, "drafted_pool": 400, "accepted_pool": 40, "step_cost_t1": 0.02,
              "carried_score": 50.0, "backend": "cpu", "live_states": 3}  # fmt: skip
    after = {"steps": 150, "tree_steps": 120, "drafted_pool": 700, "accepted_pool": 70, "step_cost_t1": 0.03,
             "carried_score": 80.5, "step_cost_t8": 0.0332, "backend": "cpu", "live_states": 5,
             "calibration": 0.7}  # fmt: skip
    delta = bs.lookahead_delta(before, after)
    assert delta["steps"] == 50 and delta["tree_steps"] == 30
    assert delta["drafted_pool"] == 300 and delta["accepted_pool"] == 30 and delta["carried_score"] == 30.5
    assert delta["step_cost_t1"] == 0.03 and delta["calibration"] == 0.7
    assert "backend" not in delta and "live_states" not in delta
    assert bs.lookahead_delta(None, after) is None and bs.lookahead_delta(before, {}) is None
    line = bs.progress({**_records()[1], "completed": 8, "lookahead": delta}, 3, 12.0)
    assert "6.0 drafts/step" in line and "step 30.0 ms at 1 token, 33.2 at 8" in line
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    assert bs.engine_env(bs.parse_args([]), "lookahead")["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in bs.engine_env(bs.parse_args([]), "suffix")


def test_headline_ratios_within_rounds(tmp_path):
    """lookahead over the best other method is taken round by round (a suffix round that beats lookahead counts in
    its own round), only from rounds where every method ran; the saved JSON rebuilds the tables."""
    recs = _records()
    for rnd, tps in enumerate([160.0, 90.0, 130.0]):
        recs.append(
            {"kind": "serve", "round": rnd, "method": "suffix", "dataset": "code", "concurrency": 4, "status": "ok",
             "output_tps": tps, "ttft_mean_ms": 40.0, "tokens_per_forward": 1.5}
        )  # fmt: skip
    table = bs.headline(recs, ["none", "suffix", "lookahead"])
    lines = table.splitlines()
    assert lines[0] == (
        "| prompts | concurrency | plain tok/s | suffix | lookahead | lookahead / best other | TTFT / plain "
        "| TTFT after the first wave / plain |"
    )
    # rounds 0 and 1 only (lookahead failed in round 2): 150/160 and 100/90; TTFT 70/50 and 70/51; after the first
    # wave 19/20 and 21/20
    assert lines[2] == (
        "| code | 4 | 100 | 1.12x (1.50) | 1.38x (2.50) | 1.02 (0.94-1.11) | 1.39 (1.37-1.40) | 1.00 (0.95-1.05) |"
    )
    assert len(lines) == 3  # the offline record is not a serve row
    path = tmp_path / "run.json"
    settings = {"methods": ["none", "suffix", "lookahead"], "datasets": ["code"], "dtype": "float32", "eager": False,
                "output_len": 128, "temperature": 0.0, "rounds": 3, "runtime": "test"}  # fmt: skip
    path.write_text(json.dumps({"settings": settings, "records": recs, "summary": []}))
    assert bs.main(["--report", str(path)]) == 0
    text = (tmp_path / "run.md").read_text()
    assert lines[2] in text and "## Every run" in text and (tmp_path / "run.png").stat().st_size > 1000


def test_interleaved_round_runs_each_cell_back_to_back(monkeypatch):
    """Every method's server is up before the first run; each dataset and concurrency then runs all methods in a row,
    in an order rotated by one a run, only the measured server running; every server is closed at the end."""
    args = bs.parse_args(["--methods", "none,suffix,lookahead", "--datasets", "chat", "--concurrency", "1,4"])
    sweep = bs.Sweep(args)
    events: list[tuple[str, ...]] = []

    class FakeServer:
        def __init__(self, method: str) -> None:
            self.method, self.running = method, True

        def memory(self) -> int:
            return 0

        def pause(self) -> None:
            self.running = False

        def resume(self) -> None:
            self.running = True

        def __exit__(self, *exc: object) -> None:
            events.append(("exit", self.method))

    servers: dict[str, FakeServer] = {}

    def start(rnd, method, model, max_model_len):
        servers[method] = FakeServer(method)
        events.append(("start", method))
        return servers[method]

    def run(server, base, model, files):
        assert [m for m, s in servers.items() if s.running] == [server.method]  # the others are stopped
        events.append(("run", base["method"], base["dataset"], str(base["concurrency"])))

    monkeypatch.setattr(sweep, "start_server", start)
    monkeypatch.setattr(sweep, "serve_run", run)
    sweep.serve_round(0, ["none", "suffix", "lookahead"], "m", 512, {})
    assert events[:3] == [("start", "none"), ("start", "suffix"), ("start", "lookahead")]
    runs = [e[1:] for e in events if e[0] == "run"]
    assert runs == [
        ("none", "chat", "1"), ("suffix", "chat", "1"), ("lookahead", "chat", "1"),
        ("suffix", "chat", "4"), ("lookahead", "chat", "4"), ("none", "chat", "4"),
    ]  # fmt: skip
    assert sorted(e[1] for e in events if e[0] == "exit") == ["lookahead", "none", "suffix"]
    assert bs.run_order(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_interleaving_stops_before_memory_runs_out(monkeypatch):
    """A server is not started where the memory left would not hold one as large as the largest up; the servers
    already up are closed, and the error says what to do."""
    bs.check_room_for_another([], 0)  # nothing up yet: nothing to size the next one by
    bs.check_room_for_another([4 << 30, 5 << 30], 7 << 30)
    with pytest.raises(bs.OutOfMemory, match="--no-interleave"):
        bs.check_room_for_another([4 << 30, 5 << 30], 6 << 30)
    args = bs.parse_args(["--methods", "none,suffix,lookahead", "--datasets", "chat", "--concurrency", "1"])
    sweep = bs.Sweep(args)
    closed: list[str] = []

    class FakeServer:
        def __init__(self, method: str) -> None:
            self.method = method

        def memory(self) -> int:
            return 5 << 30

        def pause(self) -> None: ...

        def __exit__(self, *exc: object) -> None:
            closed.append(self.method)

    monkeypatch.setattr(sweep, "start_server", lambda rnd, method, model, mml: FakeServer(method))
    monkeypatch.setattr(bs, "available_memory", lambda: 6 << 30)
    with pytest.raises(bs.OutOfMemory):
        sweep.serve_round(0, ["none", "suffix", "lookahead"], "m", 512, {})
    assert closed == ["none"]
    assert bs.tree_memory(os.getpid()) > 0 and bs.available_memory() > 0  # this test's own process


def test_a_method_without_its_package_is_skipped_only_where_it_would_have_run(tmp_path, monkeypatch):
    """--no-serve: a method whose package is missing gets one skipped offline record a dataset, no serve record;
    the other methods run offline."""
    argv = ["--methods", "none,suffix", "--datasets", "random,code", "--no-serve", "--out", str(tmp_path)]
    args = bs.parse_args(argv)
    sweep = bs.Sweep(args)
    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(bs, "_importable", lambda module: False)
    monkeypatch.setattr(sweep, "serve_round", lambda *a: pytest.fail("--no-serve started servers"))
    monkeypatch.setattr(sweep, "offline_run", lambda rnd, method, dataset, *a: ran.append((method, dataset)))
    sweep.run_rounds(MODEL, 512, {})
    assert sorted(ran) == [("none", "code"), ("none", "random")]
    skipped = {(r["kind"], r["method"], r["dataset"]) for r in sweep.records}
    assert skipped == {("offline", "suffix", "random"), ("offline", "suffix", "code")}
    assert all(r["status"] == "skipped" for r in sweep.records)


def test_one_cell_runs_again_on_the_prompts_its_sweep_gave_it(tmp_path):
    """`--prompts-as 1,4,16,64 --concurrency 16`: the 16-request run gets the prompts a whole sweep gives that level
    (not the set's first ones), random text its seed there, and the servers the sweep's --max-num-seqs."""

    class Tok:  # one token per word
        def __call__(self, text):
            return type("Enc", (), {"input_ids": text.split()})()

    def sent(files, c):
        return [rec["conversations"][0]["value"] for rec in json.loads(files["code"]["serve"][c].read_text())]

    sweep = bs.parse_args(["--datasets", "random,code", "--out", str(tmp_path / "sweep")])
    whole, _, _ = bs.write_datasets(sweep, Tok(), tmp_path / "sweep")
    cell = bs.parse_args(["--datasets", "random,code", "--concurrency", "16", "--prompts-as", "1,4,16,64"])
    one, _, _ = bs.write_datasets(cell, Tok(), tmp_path / "cell")
    alone = bs.parse_args(["--datasets", "random,code", "--concurrency", "16"])
    first, _, _ = bs.write_datasets(alone, Tok(), tmp_path / "alone")
    assert one["counts"] == {"random": {16: 64}, "code": {16: 64}} and list(one["code"]["serve"]) == [16]
    assert sent(one, 16) == sent(whole, 16) != sent(first, 16)
    assert cell.level_list == [1, 4, 16, 64] and alone.level_list == [16]
    with pytest.raises(SystemExit):
        bs.parse_args(["--concurrency", "8", "--prompts-as", "1,4,16,64"])
