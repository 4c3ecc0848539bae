"""Every export a deployment has, read into counts; windows between two scrapes (a restart said); the
speculation profile written and read back; the baseline gate; exit codes; the engine inferred from the
export. Texts here follow the engines' own format strings (cited in helpers/investigation/exports.py);
tests/test_exports_live.py reads the samples the live engines wrote under tests/exports/."""

from __future__ import annotations

import json

import pytest

from helpers.investigation.exports import Level, parse_duration, read_metrics, read_served, read_window
from helpers.investigation.metrics import Expected, Explanation, baseline_gate, explain
from helpers.investigation.metrics_report import export_engine
from helpers.profile import SpeculationProfile, parse_profile, read_profile, write_profile
from helpers.rules.conventions import Engine

TRAINED = Expected([0.70, 0.52, 0.40], "training record")


def llamacpp_scrape(drafts, per_pos, drafted=None):
    """llama.cpp b11434's /metrics page (tools/server/server-task.cpp:1565-1623): unlabelled counters,
    then the labelled per-position counter."""
    acc = sum(per_pos)
    out = []
    for name, v in (
        ("spec_decode_num_draft_tokens_total", drafted or drafts * len(per_pos)),
        ("spec_decode_num_accepted_tokens_total", acc),
        ("spec_decode_num_drafts_total", drafts),
    ):
        out += [f"# HELP llamacpp:{name} x", f"# TYPE llamacpp:{name} counter", f"llamacpp:{name} {v}"]
    out += ["# TYPE llamacpp:requests_processing gauge", "llamacpp:requests_processing 0"]
    out.append("# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter")
    out += [
        f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {a}'
        for i, a in enumerate(per_pos)
    ]
    return "\n".join(out) + "\n"


def sglang_scrape(calls, gen, gauge=2.1, steps=3, created=1.7e9):
    lab = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"'
    return (
        "\n".join(
            [
                "# TYPE sglang:spec_accept_length gauge",
                f"sglang:spec_accept_length{{{lab}}} {gauge}",
                "# TYPE sglang:spec_num_steps gauge",
                f"sglang:spec_num_steps{{{lab}}} {steps}",
                "# TYPE sglang:generation_tokens_total counter",
                f'sglang:generation_tokens_total{{{lab},is_streaming="false"}} {gen}',
                f'sglang:generation_tokens_created{{{lab},is_streaming="false"}} {created}',
                "# TYPE sglang:spec_verify_calls_total counter",
                f"sglang:spec_verify_calls_total{{{lab}}} {calls}",
                f"sglang:spec_verify_calls_created{{{lab}}} {created}",
            ]
        )
        + "\n"
    )


def write(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text if isinstance(text, str) else json.dumps(text))
    return f


def test_llamacpp_metrics_page_has_every_position(tmp_path):
    p = read_metrics(write(tmp_path, "m.txt", llamacpp_scrape(200, [120, 70, 30])))
    assert (p.engine, p.source, p.level, p.drafts) == ("llamacpp", "llamacpp-prometheus", Level.COUNTS, 200)
    assert p.accepted_per_position == (120, 70, 30) and p.accept_length == pytest.approx(2.1)
    assert p.steps_histogram() == (80, 50, 40, 30)
    lo, hi, how = p.accept_interval()
    assert lo < 2.1 < hi and "histogram" in how


def test_llamacpp_log_lines_are_per_request_and_add_up(tmp_path):
    """b11434 prints the slot's stats at the end of each request, then resets them (server-context.cpp:404,
    :715); the per-position figures are a trace-level line after it."""
    text = (
        "slot print_timing: id  0 | task 3 | draft acceptance = 0.50000 (   30 accepted /    60 generated),"
        " mean len =  2.50\nslot print_timing: id  0 | task 3 |      acc per pos = (0.800, 0.500, 0.200)\n"
        "slot print_timing: id  0 | task 9 | draft acceptance = 0.33333 (   20 accepted /    60 generated),"
        " mean len =  2.00\nslot print_timing: id  0 | task 9 |      acc per pos = (0.700, 0.250, 0.050)\n"
    )
    p = read_metrics(write(tmp_path, "server.log", text))
    assert (p.engine, p.source, p.drafts, p.total_accepted) == ("llamacpp", "llamacpp-log", 40, 50)
    assert p.accepted_per_position == (30, 15, 5) and "per-request" in p.notes[0]
    # INFO level only: totals, no positions, and what would give them
    p = read_metrics(
        write(tmp_path, "info.log", "\n".join(ln for ln in text.splitlines() if "acc per" not in ln))
    )
    assert p.level is Level.TOTALS and p.accept_length == pytest.approx(2.25) and "--metrics" in p.missing()


def test_llamacpp_completion_timings_need_the_draft_tokens(tmp_path):
    resp = [
        {
            "content": "x",
            "generation_settings": {"temperature": 0.7},
            "timings": {"predicted_n": 48, "draft_n": 60, "draft_n_accepted": 24},
        },
        {
            "content": "y",
            "generation_settings": {"temperature": 0.7},
            "timings": {"predicted_n": 48, "draft_n": 30, "draft_n_accepted": 18},
        },
    ]
    f = write(tmp_path, "completion.json", resp)
    p = read_metrics(f)
    assert (p.engine, p.level, p.drafts, p.temperature) == ("llamacpp", Level.NONE, None, 0.7)
    p = read_metrics(f, num_spec_tokens=3)
    assert (p.level, p.drafts, p.total_accepted) == (Level.TOTALS, 30, 42)
    lo, hi, how = p.accept_interval()
    assert lo < 2.4 < hi and "Bhatia-Davis" in how


def test_vllm_log_tolerates_a_field_inserted_before_per_position(tmp_path):
    line = (
        "INFO [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 1.40, Accepted throughput: 3.1 "
        "tokens/s, Drafted throughput: 23.2 tokens/s, Accepted: 40 tokens, Drafted: 300 tokens, New field: "
        "7, Per-position acceptance rate: 0.300, 0.080, 0.020, Avg Draft acceptance rate: 13.4%"
    )
    p = read_metrics(write(tmp_path, "vllm.log", line))
    assert (p.source, p.drafts, p.accepted_per_position) == ("vllm-log", 100, (30, 8, 2))


def test_vllm_per_request_metrics_and_sglang_openai_details(tmp_path):
    vl = [
        {
            "id": "cmpl-1",
            "metrics": {
                "speculative_decoding": {
                    "mean_acceptance_length": 2.0,
                    "draft_acceptance_rate": 0.33,
                    "acceptance_histogram": [10, 5, 3, 2],
                    "num_spec_steps": 20,
                    "num_accepted_draft_tokens": 17,
                    "num_draft_tokens": 60,
                    "num_spec_tokens": 3,
                }
            },
        }
    ]
    p = read_metrics(write(tmp_path, "vllm.json", vl))
    assert (p.engine, p.source, p.drafts, p.accepted_per_position) == (
        "vllm",
        "vllm-responses",
        20,
        (10, 5, 2),
    )
    sg = [
        {
            "id": "c",
            "choices": [{"text": "x"}],
            "sglext": {
                "spec_tokens_details": {"spec_verify_ct": 12, "spec_correct_drafts_histogram": [6, 3, 2, 1]}
            },
        },
        {
            "id": "d",
            "choices": [{"text": "y"}],
            "sglext": {
                "spec_tokens_details": [
                    {"spec_correct_drafts_histogram": [1, 1, 0, 0]},
                    {"spec_correct_drafts_histogram": [0, 0, 0, 2]},
                ]
            },
        },
    ]
    p = read_metrics(write(tmp_path, "sglang.json", sg))
    assert (p.engine, p.drafts, p.histogram) == ("sglang", 16, (7, 4, 2, 3))
    plain = [{"id": "c", "choices": [{"text": "x"}], "usage": {"completion_tokens": 9}}]
    with pytest.raises(ValueError, match="return_spec_tokens_details"):
        read_metrics(write(tmp_path, "plain.json", plain))


def test_sglang_scrape_log_and_server_info_give_the_accept_length_only(tmp_path):
    p = read_metrics(write(tmp_path, "m.txt", sglang_scrape(100, 260)))
    assert (p.engine, p.level, p.drafts, p.num_spec_tokens) == ("sglang", Level.TOTALS, 100, 3)
    assert p.accept_length == pytest.approx(2.6) and "most recent" in " ".join(p.notes)
    assert "return_spec_tokens_details" in p.missing()
    log = (
        "[2026-12-02 10:00:01] Decode batch, #running-req: 1, #token: 90, token usage: 0.01, accept len: 2.40, "  # noqa: E501
        "accept rate: 0.47, cuda graph: False, gen throughput (token/s): 9.1, #queue-req: 0,\n"
        "[2026-12-02 10:00:03] Decode batch, #running-req: 1, #token: 99, token usage: 0.01, accept len: 2.00, "  # noqa: E501
        "accept rate: 0.33, cuda graph: False, gen throughput (token/s): 8.0, #queue-req: 0,\n"
    )
    p = read_metrics(write(tmp_path, "server.log", log))
    assert (p.level, p.gauge, p.num_spec_tokens) == (Level.GAUGE, pytest.approx(2.2), 3)
    assert p.accept_interval() is None and "2 'Decode batch'" in p.gauge_scope
    p = read_metrics(write(tmp_path, "info.json", {"internal_states": [{"avg_spec_accept_length": 2.31}]}))
    assert (p.source, p.gauge) == ("sglang-server-info", 2.31) and "lifetime" in p.gauge_scope


def test_a_window_is_the_difference_and_a_restart_is_said(tmp_path):
    a = write(tmp_path, "a.txt", llamacpp_scrape(200, [120, 70, 30]))
    b = write(tmp_path, "b.txt", llamacpp_scrape(500, [300, 160, 60]))
    w = read_window(a, b)
    assert (w.drafts, w.accepted_per_position, w.reset) == (300, (180, 90, 30), False)
    assert "difference of two scrapes" in w.notes[0]
    # the engine restarted inside the window: its counters start again from zero
    c = write(tmp_path, "c.txt", llamacpp_scrape(50, [20, 5, 1]))
    w = read_window(b, c)
    assert (w.drafts, w.accepted_per_position, w.reset) == (50, (20, 5, 1), True)
    assert "restarted" in w.notes[0] and "not in them" in w.notes[0]
    # SGLang: the counters difference, the gauge only labelled; a re-created counter is a restart too
    s1, s2 = (
        write(tmp_path, "s1.txt", sglang_scrape(100, 260)),
        write(tmp_path, "s2.txt", sglang_scrape(300, 700, gauge=1.5)),
    )
    w = read_window(s1, s2)
    assert (w.drafts, w.accept_length, w.gauge) == (200, pytest.approx(2.2), 1.5)
    assert any("most recent" in n for n in w.notes) and not w.reset
    s3 = write(tmp_path, "s3.txt", sglang_scrape(400, 900, created=1.8e9))
    assert read_window(s2, s3).reset
    with pytest.raises(ValueError, match="different engines"):
        read_window(a, s1)
    with pytest.raises(ValueError, match="a window needs two Prometheus scrapes"):
        read_window(write(tmp_path, "r.json", [{"spec_correct_drafts_histogram": [1, 2]}]), b)


def test_window_option_polls_a_url_twice(monkeypatch):
    pages = iter([llamacpp_scrape(100, [50, 20, 5]), llamacpp_scrape(160, [80, 30, 8])])
    import helpers.investigation.exports as ex

    monkeypatch.setattr(ex, "fetch", lambda url, timeout=10.0: next(pages))
    slept = []
    w = read_served(["http://127.0.0.1:8080/metrics"], parse_duration("1m"), sleep=slept.append)
    assert slept == [60.0] and (w.drafts, w.accepted_per_position) == (60, (30, 10, 3))
    with pytest.raises(ValueError, match="polls one URL"):
        read_served(["a.txt"], 60.0)
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration("soon")


def test_no_per_position_counts_is_judged_on_the_accept_length():
    from helpers.investigation.exports import ServedProfile

    ok = ServedProfile("sglang", "sglang-prometheus", "x", 400, None, 400 * 1.55, num_spec_tokens=3)
    v = explain(ok, TRAINED, None, (0, 3, 7), (0, 3, 7))
    assert v.explanation == Explanation.OK and "accept length" in " ".join(v.evidence)
    low = ServedProfile("sglang", "sglang-prometheus", "x", 400, None, 400 * 0.6, num_spec_tokens=3)
    v = explain(low, TRAINED, None, (3, 7, 10), (0, 3, 7))
    assert v.explanation == Explanation.WIRING and "per-position counts" in v.evidence[0]
    gauge = ServedProfile("sglang", "sglang-log", "x", None, gauge=1.6, gauge_scope="log intervals")
    v = explain(gauge, TRAINED, None, (0, 3, 7), (0, 3, 7))
    assert v.explanation == Explanation.UNDETERMINED and "no count" in " ".join(v.evidence)
    assert v.exit_code == 3


def test_profile_round_trip_and_modelopt_conditional_only(tmp_path):
    prof = SpeculationProfile((0.7, 0.5, 0.3), 0.0, "greedy", "training evaluation", layout=(0, 3, 7))
    path = write_profile(tmp_path, prof)
    back = read_profile(tmp_path)
    assert back.marginal == prof.marginal and back.layout == (0, 3, 7) and back.path == path
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1 and raw["mean_accept_length"] == pytest.approx(2.5)
    assert raw["conditional_accept_rates"][1] == pytest.approx(0.5 / 0.7, abs=1e-5)
    other = parse_profile(
        {
            "version": 1,
            "conditional_accept_rates": [0.8, 0.5],
            "measurement_conditions": {"temperature": 0.0},
        },
        path,
    )
    assert other.marginal == pytest.approx((0.8, 0.4)) and other.accept_length == pytest.approx(2.2)
    for bad, why in (
        ({"schema_version": 9, "marginal_accept_rates": [0.5]}, "reads"),
        ({"marginal_accept_rates": [0.5, 0.7]}, "rise"),
        ({}, "neither"),
        ({"marginal_accept_rates": [1.5]}, "fractions"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_profile(bad, path)


def test_baseline_gate_fails_a_window_below_it():
    from helpers.investigation.exports import ServedProfile

    base = SpeculationProfile(
        (0.84, 0.56, 0.49),
        0.0,
        "greedy",
        "fix B, healthy window",
        drafts=800,
        accepted_per_position=(672, 448, 392),
        mean_interval=(2.78, 2.99),
    )
    good = ServedProfile("vllm", "vllm-prometheus", "x", 400, (330, 220, 190))
    bad = ServedProfile("vllm", "vllm-prometheus", "x", 400, (150, 80, 50))
    assert baseline_gate(good, base).passed
    g = baseline_gate(bad, base)
    assert not g.passed and "accept length" in g.failures[0] and any("position 0" in f for f in g.failures)
    v = explain(bad, TRAINED, None, (0, 3, 7), (0, 3, 7))
    v.gate = g
    assert v.exit_code == 1


def test_engine_is_inferred_from_the_export_and_a_contradiction_refused():
    engine, line = export_engine("vllm", None)
    assert engine.name == "vllm" and "inferred from the export" in line
    assert export_engine("sglang", Engine("sglang", "0.5.9"))[1] is None
    with pytest.raises(ValueError, match="the export is llamacpp's"):
        export_engine("llamacpp", Engine("sglang", "0.5.23"))


def test_cli_exit_codes(tmp_path, capsys):
    """0 ok, 1 a problem, 2 bad input, 3 undetermined; --json keeps the same fields for every source."""
    from _pairs import tiny_default

    from helpers.commands.diagnose import main

    d = tiny_default() / "draft-retrained"  # served (3, 7, 10) = trained by its record, on sglang 0.5.9
    healthy = write(
        tmp_path, "ok.json", [{"meta_info": {"spec_correct_drafts_histogram": [60, 40, 30, 270]}}]
    )
    few = write(tmp_path, "few.json", [{"meta_info": {"spec_correct_drafts_histogram": [5, 2, 1, 2]}}])
    base = ["--draft", str(d), "--json", "--steps", "3"]
    assert main(["--metrics", str(few), *base]) == 3
    keys = set(json.loads(capsys.readouterr().out.splitlines()[-1]))
    assert main(["--metrics", str(write(tmp_path, "x.txt", "nothing")), *base]) == 2
    capsys.readouterr()
    assert main(["--metrics", str(healthy), *base]) in (0, 3)
    assert set(json.loads(capsys.readouterr().out.splitlines()[-1])) == keys
    m = write(tmp_path, "m.txt", llamacpp_scrape(400, [160, 60, 20]))
    assert main(["--metrics", str(m), "--engine", "sglang", *base]) == 2
    assert "the export is llamacpp's" in capsys.readouterr().err


def test_a_window_whose_counters_did_not_move_says_so(tmp_path):
    """Nothing between the two scrapes (or a restart that served exactly as much, which SGLang's page,
    without _created samples, cannot show): said, not judged from the most recent gauge."""
    a = write(tmp_path, "a.txt", sglang_scrape(100, 260))
    b = write(tmp_path, "b.txt", sglang_scrape(100, 260, gauge=3.0))
    with pytest.raises(ValueError, match="every speculative counter is where it was"):
        read_window(a, b)


# A label value holding what the text format must escape or quote: a brace, a comma, a quote and a backslash.
_ODD = 'a}b,c "q" \\d'
_ODD_TEXT = 'a}b,c \\"q\\" \\\\d'          # the same value as the exposition text writes it


def test_label_values_are_decoded_as_the_text_format_says():
    from helpers.investigation.exports import parse_prometheus

    page = (f'vllm:spec_decode_num_drafts_total{{model_name="{_ODD_TEXT}",x="1"}} 7\n'
            f'vllm:spec_decode_num_drafts_created{{model_name="{_ODD_TEXT}",x="1"}} 5\n'
            'not a sample line at all\n')
    s = parse_prometheus(page, "page")
    key = ("vllm:spec_decode_num_drafts", (("model_name", _ODD), ("x", "1")))
    assert s.series == {key: 7.0}                # the series kept whole, its value decoded
    assert s.created == {key: 5.0}


def test_one_series_by_text_and_by_the_query_api_has_one_key():
    from helpers.investigation.exports import parse_prometheus, prometheus_readings

    page = f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{_ODD_TEXT}"}} 7\n'
    answer = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "vllm:spec_decode_num_drafts_total", "model_name": _ODD, "engine": "0"},
         "value": [1000.0, "7"]}]}})
    by_text = parse_prometheus(page, "page").series
    (reading,) = prometheus_readings("http://127.0.0.1:9090/api/v1/query", answer)
    by_api = reading.scrape().series
    key = ("vllm:spec_decode_num_drafts", (("engine", "0"), ("model_name", _ODD)))
    assert by_text == by_api == {key: 7.0}
