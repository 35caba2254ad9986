"""CPU smoke runs of every `radixgen bench` mode on the tiny model (a few prompts each).

These check that each mode runs end to end and reports consistent counts; speed is never
asserted (numbers go to docs/benchmarks.md from real runs).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset
from radixgen.runtime.cli import main as radixgen_main


def test_datasets_are_deterministic_and_shaped():
    gsp = DatasetArgs(
        dataset="generated-shared-prefix",
        gsp_num_groups=3,
        gsp_prompts_per_group=4,
        gsp_system_prompt_len=20,
        gsp_question_len=5,
        gsp_output_len=7,
    )
    first, again = build_dataset(gsp), build_dataset(gsp)
    assert [r.input_ids for r in first] == [r.input_ids for r in again]
    assert len(first) == 12 and all(r.prompt_len == 25 and r.output_len == 7 for r in first)
    assert len({tuple(r.input_ids[:20]) for r in first}) == 3  # one system prompt per group
    ranged = build_dataset(
        DatasetArgs(
            num_prompts=50, random_input_len=40, random_output_len=10, random_range_ratio=0.5
        )
    )
    assert all(20 <= r.prompt_len <= 40 and 5 <= r.output_len <= 10 for r in ranged)
    with pytest.raises(ValueError, match="random_range_ratio"):
        DatasetArgs(random_range_ratio=0.0)


def test_bench_latency_and_offline_cli(tmp_path, tiny_model_path, capsys):
    latency_json = tmp_path / "latency.json"
    assert radixgen_main(
        ["bench", "latency", "--batch-size", "1", "2", "--input-len", "8", "--output-len", "4",
         "--output-file", str(latency_json)]
    ) == 0  # fmt: skip
    rows = json.loads(latency_json.read_text())["results"]
    assert [row["batch_size"] for row in rows] == [1, 2]
    table = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(table) if "decode ms/step" in line)
    assert [line.split()[0] for line in table[header + 1 : header + 3]] == ["1", "2"]
    assert all(row["prefill_ms"] > 0 and row["decode_ms_per_step_median"] > 0 for row in rows)
    # The synced step's phases: the ids read back, the batch built, the forward launched, the
    # device waited for (on the CPU every op runs as it is launched: the wait is ~0).
    for row in rows:
        phases = row["synced_step_phases_ms"]
        assert set(phases) == {"read_ids", "build", "launch", "wait"}
        assert phases["build"] > 0 and phases["launch"] > 0
        assert sum(phases.values()) <= row["decode_ms_per_step_mean"] * 1.5
    # The overlapped pass (ids left on the device) decodes the synced pass's greedy tokens.
    assert all(row["decode_ms_per_step_overlapped_median"] > 0 for row in rows)
    assert all(row["overlapped_same_tokens"] is True for row in rows)
    # A batch past --max-prefill-tokens prefills in forwards of whole prompts (2 + 1 here):
    # the same greedy tokens as the one forward above.
    chunked_json = tmp_path / "latency_chunked.json"
    assert radixgen_main(
        ["bench", "latency", "--batch-size", "3", "--input-len", "8", "--output-len", "4",
         "--max-prefill-tokens", "16", "--output-file", str(chunked_json)]
    ) == 0  # fmt: skip
    assert radixgen_main(
        ["bench", "latency", "--batch-size", "3", "--input-len", "8", "--output-len", "4",
         "--output-file", str(latency_json)]
    ) == 0  # fmt: skip
    (chunked,) = json.loads(chunked_json.read_text())["results"]
    (whole,) = json.loads(latency_json.read_text())["results"]
    assert chunked["greedy_tokens_digest"] == whole["greedy_tokens_digest"]

    offline_json = tmp_path / "offline.json"
    assert radixgen_main(
        ["bench", "offline", "--num-prompts", "4", "--random-input-len", "16",
         "--random-output-len", "5", "--output-json", str(offline_json)]
    ) == 0  # fmt: skip
    summary = json.loads(offline_json.read_text())
    assert "requests: 100%" in capsys.readouterr().err  # the progress bar reached 4/4
    assert summary["successful_requests"] == 4
    assert summary["total_input_tokens"] == 4 * 16
    assert summary["total_output_tokens"] == 4 * 5  # ignore_eos forces the length
    stats = summary["engine_stats"]  # the scheduler loop's time: in steps, then shipping
    assert stats["step_time_s"] > 0 and stats["deliver_time_s"] > 0
    assert stats["intake_time_s"] > 0 and stats["idle_time_s"] >= 0


def test_bench_engine_flags_reach_server_args():
    from radixgen.runtime.bench.cli import _take
    from radixgen.runtime.cli import build_parser
    from radixgen.runtime.server_args import ServerArgs

    flags = ["--enable-mixed-chunk", "--enable-overlap-schedule", "--enable-jump-forward",
             "--schedule-max-wait-s", "2.5", "--new-token-ratio", "0.25"]  # fmt: skip
    namespace = build_parser().parse_args(["bench", "offline", *flags])
    server_args = _take(namespace, ServerArgs)
    assert server_args.enable_mixed_chunk and server_args.enable_jump_forward
    assert server_args.enable_overlap_schedule is True
    assert (server_args.schedule_max_wait_s, server_args.new_token_ratio) == (2.5, 0.25)
    defaults = _take(build_parser().parse_args(["bench", "offline"]), ServerArgs)
    assert defaults.enable_overlap_schedule is None  # unset: the device decides


def test_bench_hf_peer(tmp_path, tiny_model_path):
    out = tmp_path / "hf.json"
    assert radixgen_main(
        ["bench", "hf", "--batch-sizes", "1", "--input-len", "8", "--output-len", "4",
         "--output-json", str(out)]
    ) == 0  # fmt: skip
    (row,) = json.loads(out.read_text())["results"]
    assert row["variant"] == "hf-eager-dynamic-cache" and row["output_token_throughput"] > 0


def test_bench_serving_exits_1_when_every_request_fails(capsys):
    flags = ["bench", "serving", "--base-url", "http://127.0.0.1:1", "--num-prompts", "2",
             "--random-input-len", "4", "--random-output-len", "2"]  # fmt: skip
    assert radixgen_main(flags) == 1
    assert "every request failed" in capsys.readouterr().out


@pytest.fixture(scope="module")
def server(default_server):  # the suite's shared `radixgen serve --model-path tiny`
    return default_server


@pytest.mark.parametrize("backend", ["radixgen", "openai"])
@pytest.mark.parametrize(
    "dataset_flags,expected_requests",
    [
        (["--dataset", "random-ids", "--num-prompts", "4", "--random-input-len", "12",
          "--random-output-len", "4"], 4),
        (["--dataset", "generated-shared-prefix", "--gsp-num-groups", "2",
          "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "40",
          "--gsp-question-len", "4", "--gsp-output-len", "3"], 6),
        (["--dataset", "multi-turn", "--num-conversations", "2", "--num-turns", "3",
          "--turn-input-len", "8", "--turn-output-len", "3"], 6),
    ],
)  # fmt: skip
def test_bench_serving(server, tmp_path, backend, dataset_flags, expected_requests):
    out = tmp_path / "serving.json"
    flags = ["bench", "serving", "--base-url", server.base_url, "--backend", backend]
    assert (
        radixgen_main([*flags, *dataset_flags, "--max-concurrency", "4", "--output-json", str(out)])
        == 0
    )
    summary = json.loads(out.read_text())
    assert summary["successful_requests"] == expected_requests, summary.get("first_error")
    assert summary["failed_requests"] == 0
    assert summary["mean_ttft_ms"] > 0 and summary["median_e2e_latency_ms"] > 0
    # The timeline: the last request started before the run ended, and the server's scheduler
    # loop accounts for its time during the run (steps, shipping, intake, waiting).
    duration_ms = 1000 * summary["duration_s"]
    assert 0 <= summary["last_send_ms"] < summary["last_first_token_ms"] <= duration_ms
    loop_s = [summary[f"server_{name}"] for name in ("step_time_s", "deliver_time_s",
                                                    "intake_time_s", "idle_time_s")]  # fmt: skip
    assert loop_s[0] > 0 and loop_s[1] > 0 and all(value >= 0 for value in loop_s)
    assert sum(loop_s) < summary["duration_s"] + 0.5  # the loop's time during the run only
    if dataset_flags[1] != "random-ids":
        # Shared system prompts and earlier turns are served from the radix cache.
        assert summary["client_cached_tokens"] > 0 or summary.get("server_cache_hit_rate", 0) > 0


def test_bench_serving_json_workload(server, tmp_path):
    out = tmp_path / "json.json"
    assert radixgen_main(
        ["bench", "serving", "--base-url", server.base_url, "--dataset", "json",
         "--num-prompts", "2", "--json-output-len", "48", "--output-json", str(out)]
    ) == 0  # fmt: skip
    summary = json.loads(out.read_text())
    assert summary["successful_requests"] == 2, summary.get("first_error")


def test_json_array_dataset_has_fixed_length_outputs():
    requests = build_dataset(DatasetArgs(dataset="json-array", num_prompts=3, json_array_items=5))
    schema = requests[0].json_schema
    jsonschema.validate([1, 2, 3, 4, 5], schema)
    for wrong in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 10]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    assert all(request.output_len >= len("[1,2,3,4,5]") for request in requests)


def test_json_keys_dataset_is_key_heavy():
    (request,) = build_dataset(DatasetArgs(dataset="json-keys", num_prompts=1))
    schema = request.json_schema
    record = {}
    for name, sub in schema["properties"].items():
        record[name] = (
            sub["enum"][0] if "enum" in sub else (True if sub["type"] == "boolean" else 7)
        )
    jsonschema.validate(record, schema)
    with pytest.raises(jsonschema.ValidationError):  # every key is required
        jsonschema.validate({k: v for k, v in record.items() if k != name}, schema)
    # Most of an output is forced: the keys and punctuation outweigh the chosen values.
    text = json.dumps(record, separators=(",", ":"))
    chosen = sum(len(json.dumps(value)) for value in record.values())
    assert chosen / len(text) < 0.25


def write_sharegpt(path, count: int) -> None:
    """A small ShareGPT-format file: conversations of a human turn and a reply."""
    conversations = [
        {"id": str(i), "conversations": [
            {"from": "human", "value": f"def task_{i}(x):"},
            {"from": "gpt", "value": "    return x + 1" * (i + 1)},
        ]}
        for i in range(count)
    ] + [{"id": "empty", "conversations": []}]  # fmt: skip
    path.write_text(json.dumps(conversations))


def test_sharegpt_dataset_reads_a_local_file(tmp_path):
    path = tmp_path / "sharegpt.json"
    write_sharegpt(path, 5)
    requests = build_dataset(DatasetArgs(dataset="sharegpt", dataset_path=str(path), num_prompts=3))
    assert [r.text for r in requests] == ["def task_0(x):", "def task_1(x):", "def task_2(x):"]
    assert [r.output_len for r in requests] == [4, 8, 12]  # 16 characters a reply part / 4
    with pytest.raises(ValueError, match="--dataset-path"):
        build_dataset(DatasetArgs(dataset="sharegpt"))


def test_bench_flags_as_sglang_users_type_them():
    from radixgen.runtime.bench.cli import _take
    from radixgen.runtime.bench.serving import ServingArgs
    from radixgen.runtime.cli import build_parser

    namespace = build_parser().parse_args(
        ["bench", "serving", "--host", "10.0.0.2", "--port", "8000", "--dataset-name", "json",
         "--output-file", "out.json"]
    )  # fmt: skip
    assert _take(namespace, ServingArgs).url == "http://10.0.0.2:8000"
    assert namespace.dataset_dataset == "json" and namespace.output_json == "out.json"
    assert ServingArgs().url == "http://127.0.0.1:30000"
    for mode in ("offline", "latency"):
        with pytest.raises(SystemExit):  # server-only flags are not listed there
            build_parser().parse_args(["bench", mode, "--api-key", "k"])


def test_bench_serving_sharegpt_by_host_and_port(server, tmp_path):
    path, out = tmp_path / "sharegpt.json", tmp_path / "sharegpt-out.json"
    write_sharegpt(path, 3)
    host, port = server.base_url.removeprefix("http://").split(":")
    assert radixgen_main(
        ["bench", "serving", "--host", host, "--port", port, "--dataset-name", "sharegpt",
         "--dataset-path", str(path), "--num-prompts", "3", "--output-file", str(out)]
    ) == 0  # fmt: skip
    summary = json.loads(out.read_text())
    assert summary["successful_requests"] == 3, summary.get("first_error")
    assert summary["total_output_tokens"] == 4 + 8 + 12  # ignore_eos forces the lengths
