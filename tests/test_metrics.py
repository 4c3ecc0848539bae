"""diagnose --metrics: every format a deployment exports, read into counts, and the verdicts on
synthetic counters (healthy, miswired, broken, too few to say)."""
from __future__ import annotations

import json

import pytest

from helpers.investigation.metrics import Expected, Explanation, ServedProfile, explain, read_metrics, wilson

TRAINED = Expected([0.70, 0.52, 0.40], "training record")


def scrape(drafts: int, per_pos: list[int], engines: int = 1) -> str:
    """A /metrics page as vLLM 0.32's prometheus_client writes it (counters with _total and _created)."""
    out = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
           "# TYPE vllm:spec_decode_num_drafts_total counter"]
    for e in range(engines):
        labels = f'engine="{e}",model_name="/m/t"'
        out.append(f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts / engines:.1f}")
        out.append(f'vllm:spec_decode_num_drafts_created{{engine="{e}",model_name="/m/t"}} 1.7649e+09')
    out += ["# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    for e in range(engines):
        for i, a in enumerate(per_pos):
            out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="/m/t",'
                       f'position="{i}"}} {a / engines:.1f}')
    out.append('vllm:num_requests_running{engine="0",model_name="/m/t"} 0.0')
    return "\n".join(out) + "\n"


def test_prometheus_scrape_sums_engines_and_positions(tmp_path):
    f = tmp_path / "metrics.txt"
    f.write_text(scrape(400, [280, 200, 150], engines=2))
    p = read_metrics(f)
    assert (p.engine, p.source, p.drafts) == ("vllm", "vllm-prometheus", 400)
    assert p.accepted_per_position == (280, 200, 150)
    assert p.accept_length == pytest.approx(1 + 630 / 400)
    row = p.per_position()[0]
    assert row["rate"] == 0.7 and row["interval"][0] < 0.7 < row["interval"][1]


def test_vllm_log_lines_add_up(tmp_path):
    line = ("INFO 12-01 10:00:0{i} [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 1.40, "
            "Accepted throughput: 3.10 tokens/s, Drafted throughput: 23.20 tokens/s, Accepted: {a} tokens, "
            "Drafted: {d} tokens, Per-position acceptance rate: {r}, Avg Draft acceptance rate: 13.4%")
    f = tmp_path / "vllm.log"
    f.write_text(line.format(i=1, a=40, d=300, r="0.300, 0.080, 0.020") + "\nnoise\n"
                 + line.format(i=2, a=20, d=150, r="0.300, 0.080, 0.020") + "\n")
    p = read_metrics(f)
    assert (p.source, p.drafts, p.accepted_per_position) == ("vllm-log", 150, (45, 12, 3))


def test_llamacpp_older_log_takes_the_running_total(tmp_path):
    f = tmp_path / "server.log"
    f.write_text("draft acceptance = 0.50000 ( 10 accepted / 20 generated), mean acceptance length = 2.00, "
                 "acceptance rate per position = (0.700, 0.300)\n"
                 "draft acceptance = 0.62008 ( 1797 accepted /  2898 generated), "
                 "mean acceptance length =  2.24, acceptance rate per position = (0.727, 0.513)\n")
    p = read_metrics(f)
    assert (p.engine, p.drafts) == ("llamacpp", 1449) and p.accepted_per_position == (1053, 743)


def test_sglang_responses_and_meta_info(tmp_path):
    f = tmp_path / "responses.json"
    resp = [{"text": "x",
             "meta_info": {"spec_correct_drafts_histogram": [5, 3, 2, 10], "spec_verify_ct": 20}},
            {"spec_correct_drafts_histogram": [1, 1, 0, 2]}, {"meta_info": {"completion_tokens": 4}}]
    f.write_text(json.dumps(resp))
    p = read_metrics(f)
    # 24 verify steps; position 0 accepted whenever 1+ drafts were correct, position 2 only with all 3
    assert (p.engine, p.drafts, p.accepted_per_position) == ("sglang", 24, (18, 14, 12))
    assert p.accept_length == pytest.approx(1 + 44 / 24) and "2 of 3 responses" in p.notes[0]


@pytest.mark.parametrize("content, expected", [
    ("", "no speculative-decoding metrics found"),
    ("[{\"meta_info\": {\"completion_tokens\": 3}}]", "no item carries speculative counts"),
    ("[1, 2]", "item 0 is a JSON int"),
    ("[{\"spec_correct_drafts_histogram\": \"7\"}]", "expected a list of counts"),
    (scrape(0, [0, 0, 0]), "reports 0 verify steps"),
])
def test_bad_sources_are_one_clear_error(content, expected, tmp_path):
    f = tmp_path / "m.txt"
    f.write_text(content)
    with pytest.raises(ValueError, match=None) as exc:
        read_metrics(f)
    assert expected in str(exc.value) and str(f) in str(exc.value)


def test_urls_need_a_scheme_and_host_and_files_must_exist():
    with pytest.raises(ValueError, match="expected an http\\(s\\) URL with a host"):
        read_metrics("http:///metrics")
    with pytest.raises(ValueError, match="no such file"):
        read_metrics("/no/such/metrics.txt")


def profile(rates, drafts=400):
    return ServedProfile("vllm", "prometheus", "x", drafts, tuple(round(r * drafts) for r in rates))


def test_verdicts_on_synthetic_counters():
    healthy = explain(profile([0.68, 0.50, 0.39]), TRAINED, None, (0, 3, 7), (0, 3, 7))
    assert healthy.explanation == Explanation.OK
    # the vLLM PR #50170 fingerprint of a head whose ids were guessed: with the layouts known, the wiring
    guessed = explain(profile([0.036, 0.0006, 0.0], 2000), TRAINED, None, (2, 6, 9), (0, 3, 7))
    assert guessed.explanation == Explanation.WIRING
    broken = explain(profile([0.01, 0.0, 0.0], 2000), TRAINED, None, (0, 3, 7), (0, 3, 7))
    assert broken.explanation == Explanation.BROKEN_DRAFT
    assert explain(profile([0.01, 0.0, 0.0], 2000), TRAINED).explanation == Explanation.BROKEN_DRAFT
    wiring = explain(profile([0.30, 0.10, 0.03]), TRAINED, Expected([0.31, 0.11, 0.04], "sim"), (3, 7, 10),
                     (0, 3, 7))
    assert wiring.explanation == Explanation.WIRING and "(3, 7, 10)" in " ".join(wiring.evidence)
    # below even what the served layout simulates to: vLLM's CPU rotary bug (23.9% where 31.5% was due)
    differs = explain(profile([0.239, 0.08, 0.02], 2000), TRAINED, Expected([0.315, 0.11, 0.04], "sim"),
                      (2, 6, 9), (2, 6, 9))
    assert differs.explanation == Explanation.ENGINE_DIFFERS
    weak = explain(profile([0.45, 0.25, 0.12]), TRAINED, None, (0, 3, 7), (0, 3, 7))
    assert weak.explanation == Explanation.WEAK_DRAFT
    flag = explain(profile([0.45, 0.25, 0.12]), TRAINED, None, (0, 3, 7), (0, 3, 7),
                   ("norm_before_fc ignored",))
    assert flag.explanation == Explanation.IGNORED_FLAG
    unknown = explain(profile([0.30, 0.10, 0.03]), TRAINED)
    assert unknown.explanation == Explanation.UNDETERMINED and "--target" in unknown.next[0]


def test_a_known_mismatch_is_never_ok_even_on_easy_traffic():
    """Measured on vLLM 0.32 serving the embedded deployed draft on its own greedy continuations: position
    0 at 0.686 of 105, level with the training record's 0.70, while vLLM serves (2, 6, 9) to a draft
    trained on (0, 3, 7). The counts alone would say ok; the layouts say the draft is fed other states."""
    v = explain(profile([0.686, 0.457, 0.295], 105), TRAINED, Expected([0.45, 0.2, 0.1], "sim"), (2, 6, 9),
                (0, 3, 7))
    assert v.explanation == Explanation.WIRING and "easier" in " ".join(v.evidence)
    assert explain(profile([0.686, 0.457, 0.295], 105), TRAINED, None, (0, 3, 7), (0, 3, 7)).explanation \
        == Explanation.OK


def test_forty_drafts_cannot_separate_030_from_035():
    lo, hi = wilson(12, 40)
    assert lo < 0.30 < 0.35 < hi
    few = explain(profile([0.30, 0.1, 0.0], drafts=20), TRAINED, None, (3, 7, 10), (0, 3, 7))
    assert few.explanation == Explanation.UNDETERMINED and "too few" in few.evidence[-1]


def test_cli_end_to_end_on_the_tiny_pair(tmp_path, capsys):
    """The served profile of a miswired deployment (the deployed draft's own simulated served figures,
    as counts) against the tiny pair: the CLI names the wiring and the served layout."""
    from _pairs import tiny_default

    from helpers.commands.diagnose import main

    d = tiny_default()
    f = tmp_path / "responses.json"      # 600 verify steps: 150 reach position 0, 40 position 1, 10 position 2  # noqa: E501
    f.write_text(json.dumps([{"meta_info": {"spec_correct_drafts_histogram": [450, 110, 30, 10]}}]))
    rc = main(["--metrics", str(f), "--draft", str(d / "draft"), "--target", str(d / "target"), "--engine",
               "sglang==0.5.9", "--windows", "4", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["served_layout"] == [3, 7, 10] and out["trained_layout"] == [0, 3, 7]
    # the responses carry no temperature; judged at 0 and at the engines' default 1 under SGLang 0.5.9's own
    # rule (target-only, read from its files), the finding is the same: it stands, and says both
    assert out["explanation"] == "wiring" and rc == out["exit_code"] == 1
    assert out["alternative"]["temperature"] == 1.0 and out["alternative"]["explanation"] == "wiring"
    rule = next(e for e in out["evidence"] if e.startswith("acceptance above temperature 0"))
    assert "sglang 0.5.9 accepts above temperature 0 by target-only" in rule
    assert "read from its files: sglang/srt/speculative/eagle_info.py:361" in rule
    rc = main(["--metrics", str(f), "--draft", str(d / "draft"), "--target", str(d / "target"), "--engine",
               "sglang==0.5.9", "--windows", "4", "--temperature", "0", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["explanation"] == "wiring" and rc == out["exit_code"] == 1
    assert out["expected_source"].startswith("speculation_profile.json: training evaluation")
    assert len(out["per_position"]) == 3
    assert out["explanation"] in ("wiring", "engine-differs"), out["evidence"]
    assert out["served_predicted_per_position"][0] < out["expected_per_position"][0]
    # no --draft: one line, before anything loads
    assert main(["--metrics", str(f)]) == 2
    assert "--metrics needs --draft DIR" in capsys.readouterr().err


def test_an_unknown_temperature_that_changes_the_finding_is_undetermined():
    """Position 0 at 0.25 over 600 rounds, served = trained: below the greedy expectation (the engine would
    differ), above what the engine's rule reaches at temperature 1 (it would be fine): exit 3, both named."""
    from helpers.investigation.metrics import _settle_unknown_temperature

    prof = ServedProfile("sglang", "sglang-responses", "r.json", 600, (150, 40, 10))
    greedy = Expected([0.69, 0.50, 0.37], "greedy", 0.0)
    sampled = Expected([0.20, 0.05, 0.01], "sglang's target-only at temperature 1", 1.0)
    at0 = explain(prof, greedy, greedy, (0, 3, 7), (0, 3, 7))
    at1 = explain(prof, sampled, sampled, (0, 3, 7), (0, 3, 7))
    assert (at0.explanation, at1.explanation) == (Explanation.ENGINE_DIFFERS, Explanation.OK)
    _settle_unknown_temperature(at0, at1, 0.0, 1.0)
    assert at0.explanation == Explanation.UNDETERMINED and at0.exit_code == 3
    assert at0.evidence[0].startswith("the temperature is not in the source, and the finding depends on it: "
                                      "engine-differs at 0, ok at 1")
    assert at0.next[0].startswith("settle it: --temperature T")
