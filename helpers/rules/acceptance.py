"""How an engine accepts a draft token when the traffic samples (temperature above 0), read from the release's
own files where they are at hand.

At temperature 0 every engine accepts a draft token when it is the target's argmax. Above it, each engine
has a rule of its own, and the expected accept length of a draft follows that rule, not one formula for all:

- **target-only**: the draft proposes its own argmax and the target accepts it with probability ``p(x)``, its
  distribution after the engine's sampler (temperature and, where the engine applies them by default, top-k,
  top-p, min-p). vLLM's default (``draft_sample_method = "greedy"``, so ``draft_probs`` is None and the
  rejection kernel takes ``draft_prob = 1``), llama.cpp's (greedy drafting, then sample-and-match: the
  target's sampled token must equal the draft's), SGLang's on a GPU
  (``tree_speculative_sampling_target_only``).
- **speculative-sampling**: the draft samples at the same temperature and the target accepts with
  ``min(1, p/q)``: ``sum_v min(p(v), q(v))`` per step. vLLM with ``draft_sample_method = "probabilistic"``,
  llama.cpp with probabilistic drafting.
- **greedy**: the target's argmax decides at any temperature: SGLang on a CPU host (``_verify_uses_greedy``
  returns True for ``is_cpu``).

``rule_for`` answers for one engine family and release: from that release's files when they can be read
(``read_vllm``, ``read_sglang``, ``read_llamacpp``, each citing the file and line it found), else from
``RECORDED``, which names the release it was read from and says it was not read now. Results are data;
``AcceptanceRule.sentence`` words one at the edge. Imports: ``rules.wheels`` (and, to read a release,
``engines.vllm.own`` or ``engines.sglang.source``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from . import wheels


class Verify(StrEnum):
    TARGET_ONLY = "target-only"
    SPECULATIVE = "speculative-sampling"
    GREEDY = "greedy"


@dataclass(frozen=True)
class Sampler:
    """The target's sampler as the engine applies it to a request that names only a temperature."""

    top_k: int = 0            # 0: off
    top_p: float = 1.0        # 1: off
    min_p: float = 0.0        # 0: off
    filters_first: bool = False   # llama.cpp: top-k, top-p and min-p act before the temperature is applied

    @property
    def off(self) -> bool:
        return self.top_k <= 0 and self.top_p >= 1.0 and self.min_p <= 0.0

    def words(self) -> str:
        if self.off:
            return "temperature only"
        parts = [f"top-k {self.top_k}" if self.top_k > 0 else "",
                 f"top-p {self.top_p:g}" if self.top_p < 1 else "",
                 f"min-p {self.min_p:g}" if self.min_p > 0 else ""]
        return ", ".join(p for p in parts if p) + (", then the temperature" if self.filters_first else "")


@dataclass(frozen=True)
class AcceptanceRule:
    engine: str                   # vllm | sglang | llamacpp | lmdeploy
    release: str                  # the release whose files say so (read, or recorded from)
    verify: Verify
    sampler: Sampler
    where: tuple[str, ...]        # file:line of that release, per fact
    read: bool                    # True: read from the release's files now; False: the recorded rule
    device: str = ""              # "cpu" where the rule depends on it (SGLang)

    def sentence(self) -> str:
        how = {Verify.TARGET_ONLY: "the draft proposes its argmax and the target accepts it with its own "
                                   "probability of that token",
               Verify.SPECULATIVE: "the draft samples and the target accepts with min(1, p/q)",
               Verify.GREEDY: "the target's argmax decides at any temperature"}[self.verify]
        src = "read from its files" if self.read else "recorded from its files, not read now"
        on = f" on a {self.device.upper()}" if self.device else ""
        return (f"{self.engine} {self.release}{on} accepts above temperature 0 by {self.verify}: {how}; "
                f"target sampler: {self.sampler.words()} ({src}: {'; '.join(self.where)})")


# What each family's release named here does, read from its files (the recorded rule when none can be read).
RECORDED: dict[str, AcceptanceRule] = {
    "vllm": AcceptanceRule(
        "vllm", "0.32.0", Verify.TARGET_ONLY, Sampler(),
        ("vllm/config/speculative.py:600 draft_sample_method = \"greedy\"",
         "vllm/v1/sample/rejection_sampler.py:872 no draft probabilities: draft_prob = 1",
         "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py:188 no draft probabilities: "
         "draft_log_prob = 0.0",
         "vllm/sampling_params.py:312-318 top_k 0, top_p 1, min_p 0"), False),
    "sglang": AcceptanceRule(
        "sglang", "0.5.23", Verify.TARGET_ONLY, Sampler(),
        ("sglang/srt/speculative/eagle_utils.py:718 sampling_fn = tree_speculative_sampling_target_only",
         "sglang/srt/sampling/sampling_params.py:158-160 top_k 0, top_p 1, min_p 0"), False),
    "sglang-cpu": AcceptanceRule(
        "sglang", "0.5.23", Verify.GREEDY, Sampler(),
        ("sglang/srt/speculative/eagle_utils.py:500 return is_all_greedy or is_cpu or is_xpu or (is_hip "
         "and not use_rejection_sampling)",
         "sglang/srt/sampling/sampling_params.py:158-160 top_k 0, top_p 1, min_p 0"), False, "cpu"),
    "llamacpp": AcceptanceRule(
        "llamacpp", "b11434", Verify.TARGET_ONLY, Sampler(40, 0.95, 0.05, True),
        ("common/common.h:337 probabilistic = false (greedy drafting)",
         "tools/server/server-context.cpp:4268 common_sampler_sample_and_accept_n (sample, then match)",
         "common/common.h:233-235 top_k 40, top_p 0.95, min_p 0.05"), False),
    "lmdeploy": AcceptanceRule(
        "lmdeploy", "0.18.0", Verify.TARGET_ONLY, Sampler(50),
        ("lmdeploy/pytorch/spec_decode/proposers/eagle3.py:136 draft_token_ids = logits.argmax(...) "
         "(greedy drafting)",
         "lmdeploy/pytorch/spec_decode/spec_agent.py:476 self.rejection_sampler(...) without draft "
         "probabilities",
         "lmdeploy/messages.py:182-184 top_k 50, top_p 1, min_p 0"), False),
}


def _line(text: str, pattern: str) -> tuple[int, re.Match] | None:
    rx = re.compile(pattern)
    for i, line in enumerate(text.splitlines(), 1):
        m = rx.search(line)
        if m:
            return i, m
    return None


def _read(root: Path, rel: str) -> str | None:
    p = root / rel
    return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None


def _python_defaults(text: str, names: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """The annotated defaults ``name: type = value`` of a sampling-params class, for ``names``: (line, value).
    A named constant such as SGLang's ``TOP_K_ALL`` means the filter is off (0)."""
    out = {}
    for n in names:
        hit = _line(text, rf"^\s*{n}\s*:\s*[\w\[\] |.]+=\s*(-?[\d.]+|[A-Z_]+)\b")
        if hit:
            v = hit[1].group(1)
            out[n] = (hit[0], 0.0 if v[0].isalpha() else float(v))
    return out


def _sampler(d: dict[str, tuple[int, float]], rel: str, filters_first: bool = False) -> tuple[Sampler, str]:
    s = Sampler(max(0, int(d.get("top_k", (0, 0))[1])), d.get("top_p", (0, 1.0))[1],
                d.get("min_p", (0, 0.0))[1], filters_first)
    lines = sorted(v[0] for v in d.values())
    at = f":{lines[0]}-{lines[-1]}" if lines else ""
    return s, f"{rel}{at} top_k {s.top_k}, top_p {s.top_p:g}, min_p {s.min_p:g}"


V1_REJECTION = "vllm/v1/sample/rejection_sampler.py"                          # V1 runner's (gone in 0.34)
V2_REJECTION = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"    # V2 runner's


def read_vllm(root: Path, release: str) -> AcceptanceRule | None:
    """vLLM's rule from a release's Python (``root`` holds ``vllm/``): the draft's sampling default and each
    runner's rejection kernel without draft probabilities (V1: ``draft_prob = 1``; V2: ``draft_log_prob =
    0``).
    None where the files do not say."""
    spec = _read(root, "vllm/config/speculative.py")
    kernels = [(rel, text) for rel in (V1_REJECTION, V2_REJECTION) if (text := _read(root, rel)) is not None]
    if spec is None or not kernels:
        return None
    where = []
    method = _line(spec, r"draft_sample_method\s*:\s*\w+\s*=\s*\"(\w+)\"")
    if method:
        where.append(f"vllm/config/speculative.py:{method[0]} draft_sample_method = \"{method[1].group(1)}\"")
        verify = Verify.TARGET_ONLY if method[1].group(1) == "greedy" else Verify.SPECULATIVE
    else:   # releases before the setting: the proposer always drafts its argmax
        verify = Verify.TARGET_ONLY
        where.append("vllm/config/speculative.py: no draft_sample_method (drafts are the argmax)")
    if verify is Verify.TARGET_ONLY:
        found = [(rel, hit) for rel, text in kernels
                 if (hit := _line(text, r"\bdraft_(?:prob|log_prob)\s*=\s*(?:1|0\.0)\b")) is not None]
        if not found:
            return None
        where += [f"{rel}:{hit[0]} no draft probabilities: {hit[1].group(0)}" for rel, hit in found]
    rel = "vllm/sampling_params.py"
    sampler, said = _sampler(_python_defaults(_read(root, rel) or "", ("top_k", "top_p", "min_p")), rel)
    where.append(said)
    return AcceptanceRule("vllm", release, verify, sampler, tuple(where), True)


def read_sglang(root: Path, release: str, device: str | None = None) -> AcceptanceRule | None:
    """SGLang's rule from a release's files (``root`` holds ``sglang/``), its EAGLE verify in
    ``srt/speculative/``: on a CPU, whether verify is greedy whatever the temperature (0.5.23's
    ``_verify_uses_greedy`` returns True for ``is_cpu``; earlier releases fall back to greedy where
    ``TREE_SPEC_KERNEL_AVAILABLE``, CUDA only, is False); elsewhere the target-only tree sampling."""
    spec = root / "sglang" / "srt" / "speculative"
    files = sorted((p for p in spec.glob("*.py") if "ngram" not in p.name),   # EAGLE's own files first
                   key=lambda p: (not p.name.startswith("eagle"), p.name)) if spec.is_dir() else []
    if not files:
        return None
    rel = "sglang/srt/sampling/sampling_params.py"
    sampler, tail = _sampler(_python_defaults(_read(root, rel) or "", ("top_k", "top_p", "min_p")), rel)

    def first(pattern: str) -> str | None:
        for p in files:
            hit = _line(p.read_text(encoding="utf-8", errors="replace"), pattern)
            if hit:
                return f"sglang/srt/speculative/{p.name}:{hit[0]} {hit[1].group(0).strip()}"
        return None

    if device == "cpu":
        greedy = (first(r"return .*\bis_cpu\b.*")
                  or first(r"if .*is_all_greedy or not TREE_SPEC_KERNEL_AVAILABLE"))
        if greedy:
            cuda_only = first(r"TREE_SPEC_KERNEL_AVAILABLE\s*=\s*_is_cuda\b")
            return AcceptanceRule("sglang", release, Verify.GREEDY, sampler,
                                  tuple(w for w in (greedy, cuda_only, tail) if w), True, "cpu")
    target = first(r"\S*\s*=?\s*tree_speculative_sampling_target_only\s*(\(|$)")   # called or chosen
    if target is None:
        return None
    return AcceptanceRule("sglang", release, Verify.TARGET_ONLY, sampler, (target, tail), True, device or "")


def read_llamacpp(texts: dict[str, str], build: str) -> AcceptanceRule | None:
    """llama.cpp's rule from a build's source (relative path from ``llama.cpp/`` -> text): the drafting
    default, the server's verify call and the sampler's defaults."""
    common, server = texts.get("common/common.h"), texts.get("tools/server/server-context.cpp")
    if common is None or server is None:
        return None
    prob = _line(common, r"bool\s+probabilistic\s*=\s*(true|false)")
    match = _line(server, r"common_sampler_sample_and_accept_n\(")
    if match is None:
        return None
    verify = Verify.SPECULATIVE if prob and prob[1].group(1) == "true" else Verify.TARGET_ONLY
    where = [f"common/common.h:{prob[0]} probabilistic = {prob[1].group(1)}"
             + (" (greedy drafting)" if verify is Verify.TARGET_ONLY else " (sampled drafting)") if prob
             else "common/common.h: no probabilistic drafting",
             f"tools/server/server-context.cpp:{match[0]} common_sampler_sample_and_accept_n "
             f"(sample, then match)"]
    vals = {}
    for n in ("top_k", "top_p", "min_p"):
        hit = _line(common, rf"\b{n}\s*=\s*(-?[\d.]+)f?\s*;")
        if hit:
            vals[n] = (hit[0], float(hit[1].group(1)))
    if len(vals) == 3:
        where.append(f"common/common.h:{vals['top_k'][0]}-{vals['min_p'][0]} top_k {int(vals['top_k'][1])}, "
                     f"top_p {vals['top_p'][1]:g}, min_p {vals['min_p'][1]:g}")
    sampler = Sampler(int(vals.get("top_k", (0, 40))[1]), vals.get("top_p", (0, 0.95))[1],
                      vals.get("min_p", (0, 0.05))[1], True)
    return AcceptanceRule("llamacpp", build, verify, sampler, tuple(where), True)


LMDEPLOY_PROPOSER = "lmdeploy/pytorch/spec_decode/proposers/eagle3.py"
LMDEPLOY_AGENT = "lmdeploy/pytorch/spec_decode/spec_agent.py"
LMDEPLOY_SAMPLING = "lmdeploy/messages.py"
LMDEPLOY_FILES = (LMDEPLOY_PROPOSER, LMDEPLOY_AGENT, LMDEPLOY_SAMPLING)


def read_lmdeploy(root: Path, release: str) -> AcceptanceRule | None:
    """LMDeploy's rule from a release's Python (``root`` holds ``lmdeploy/``): the EAGLE-3 proposer drafts
    its argmax, and the agent calls the rejection sampler with or without the draft's probabilities (without:
    a draft token is accepted with the target's probability of it); the sampler's defaults are
    ``GenerationConfig``'s, which a request naming only a temperature keeps. None where the files do not
    say."""
    proposer, agent = _read(root, LMDEPLOY_PROPOSER), _read(root, LMDEPLOY_AGENT)
    if proposer is None or agent is None:
        return None
    drafts = _line(proposer, r"draft_token_ids\s*=\s*logits\.argmax\(")
    call = _line(agent, r"self\.rejection_sampler\(")
    if drafts is None or call is None:
        return None
    lines = agent.splitlines()
    depth, args = 0, []
    for text in lines[call[0] - 1:call[0] + 20]:       # the call's text, to its closing parenthesis
        args.append(text)
        depth += text.count("(") - text.count(")")
        if depth <= 0:
            break
    probs = "draft_probs" in "\n".join(args)
    verify = Verify.SPECULATIVE if probs else Verify.TARGET_ONLY
    where = [f"{LMDEPLOY_PROPOSER}:{drafts[0]} draft_token_ids = logits.argmax(...) (greedy drafting)",
             f"{LMDEPLOY_AGENT}:{call[0]} self.rejection_sampler(...) "
             + ("with the draft's probabilities" if probs else "without draft probabilities")]
    defaults = _python_defaults(_read(root, LMDEPLOY_SAMPLING) or "", ("top_k", "top_p", "min_p"))
    sampler, said = _sampler(defaults, LMDEPLOY_SAMPLING)
    return AcceptanceRule("lmdeploy", release, verify, sampler, (*where, said), True)


LLAMACPP_FILES = ("common/common.h", "tools/server/server-context.cpp")


def recorded(engine: str, device: str | None = None) -> AcceptanceRule:
    """The recorded rule of a family (SGLang on a CPU: its greedy verify)."""
    if engine == "sglang" and device == "cpu":
        return RECORDED["sglang-cpu"]
    rule = RECORDED[engine]
    return replace(rule, device=device or "") if device and engine != "sglang" else rule


def llamacpp_source_dir(build: str) -> Path:
    """Where a llama.cpp build's files that decide acceptance are kept beside its server (``LLAMACPP_FILES``,
    copied from the sdist when the server is built)."""
    return wheels.cache_root("llama.cpp") / f"{build}-source"


def rule_for(engine: str, release: str | None,
             device: str | None = None) -> tuple[AcceptanceRule, str | None]:
    """The acceptance rule of ``engine`` (a family) at ``release``, read from that release's files: vLLM's
    Python from its wheel (by ranges, cached), SGLang's from its wheel, llama.cpp's kept beside its built
    server. Returns (the rule, None), or (the recorded rule, why it was not read)."""
    try:
        if release is None:
            raise LookupError("no release named")
        if engine == "vllm":
            from ..engines.vllm import own
            rule = read_vllm(own.release_package(release), release)
        elif engine == "sglang":
            from ..engines.sglang.source import get_source
            rule = read_sglang(get_source(release).root, release, device)
        elif engine == "lmdeploy":
            from ..engines.lmdeploy import source as lmdeploy_source
            rule = read_lmdeploy(lmdeploy_source.fetch(release), release)
        elif engine == "llamacpp":
            root = llamacpp_source_dir(release)
            rule = read_llamacpp({f: (root / f).read_text(encoding="utf-8", errors="replace")
                                  for f in LLAMACPP_FILES if (root / f).is_file()}, release)
        else:
            raise LookupError(f"no acceptance rule for {engine}")
        if rule is None:
            raise LookupError(f"{engine} {release}'s files do not say")
        return rule, None
    except Exception as e:   # noqa: BLE001 - any way the files cannot be read falls back, and says why
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        return recorded(engine, device), why
