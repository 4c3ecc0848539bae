"""Forward flags: config booleans that change the draft's forward without changing a shape, and which
engine release runs each (read from the engines' draft model files; docs/conventions.md, "Forward
flags"). Also which draft class an engine builds for a config."""
from __future__ import annotations

from typing import Sequence

from ..boundaries import ProblemKind
from ..engines.vllm.rule import (
    VLLM_DRAFT_CLASS_FIRST,
    VLLM_NEWEST_READ,
    VLLM_SPECULATORS_CONFIG_FIRST,
    VLLM_SPECULATORS_PASSES,
    at_least,
)
from .conventions import (
    MLA_DRAFT_ARCHS,
    SGLANG_DRAFT_ARCH,
    Engine,
    architectures,
    is_speculators_format,
    rules_of,
    version_key,
)

LLAMA_CLASS, MLA_CLASS = "llama_eagle3", "mla"


def honours_norm_before_residual(engine: Engine) -> bool | None:
    """Whether ``engine``'s EAGLE-3 draft forward implements ``norm_before_residual`` (vLLM from 0.10.1;
    no SGLang release read so far; None: its draft files are not read, TensorRT-LLM)."""
    return engine.rules.honours_norm_before_residual(engine)


def sets_norm_before_residual(cfg: dict) -> bool:
    layer = (cfg.get("transformer_layer_config")
             if isinstance(cfg.get("transformer_layer_config"), dict) else {})
    return bool(cfg.get("norm_before_residual") or layer.get("norm_before_residual"))


FORWARD_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


# (engine, draft class) -> flag -> first release read whose draft file runs it; None: no release
# read runs it. Read from every cached release's model file (SGLang 0.5.9-0.5.23: llama_eagle3.py,
# kimi_k25_eagle3.py; vLLM 0.17.0-0.33.0: llama_eagle3.py, deepseek_eagle3.py and, for
# speculators-format configs, transformers_utils/configs/speculators/algos.py, which must pass the
# flag on); docs/conventions.md "Forward flags" has the evidence. MLA drafts exist in SGLang from
# 0.5.12 (kimi_k25_eagle3.py) and in vLLM from 0.18.0 (deepseek_eagle3.py).
FLAG_FIRST: dict[tuple[str, str], dict[str, str | None]] = {
    ("sglang", LLAMA_CLASS): {"norm_before_residual": None, "norm_before_fc": "0.5.17", "fc_norm": "0.5.12",
                              "norm_output": "0.5.12"},
    ("sglang", MLA_CLASS): {"norm_before_residual": None, "norm_before_fc": None, "fc_norm": "0.5.13",
                            "norm_output": "0.5.13"},
    ("vllm", LLAMA_CLASS): {"norm_before_residual": "0.10.1", "norm_before_fc": "0.18.0",
                            "fc_norm": "0.22.0", "norm_output": "0.22.0"},
    # deepseek_eagle3 built fc_norm from 0.22.0 but applied it only from VLLM_DS_FCN (vLLM PR #43482)
    ("vllm", MLA_CLASS): {"norm_before_residual": "0.18.0", "norm_before_fc": None, "fc_norm": "0.23.0",
                          "norm_output": "0.22.0"},
}


DRAFT_FILES = {("sglang", LLAMA_CLASS): "SGLang's llama_eagle3.py",
               ("sglang", MLA_CLASS): "SGLang's kimi_k25_eagle3.py",
               ("vllm", LLAMA_CLASS): "vLLM's llama_eagle3.py",
               ("vllm", MLA_CLASS): "vLLM's deepseek_eagle3.py"}


FIRST_MLA_DRAFT = {"sglang": "0.5.12", "vllm": "0.18.0"}


FLAGS_NEWEST_READ = {"sglang": "0.5.23", "vllm": VLLM_NEWEST_READ}


def draft_flags(cfg: dict) -> dict[str, bool]:
    """The forward flags a draft config sets, read where engines read them: top level, the
    speculators layer config, ``eagle_config`` (norm_before_fc), and SGLang's legacy ``use_aux_norm``
    for fc_norm."""
    layer = cfg.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    out = {}
    for flag in FORWARD_FLAGS:
        value = cfg.get(flag, layer.get(flag))
        if flag == "norm_before_fc" and flag in nested:
            value = nested[flag]
        if flag == "fc_norm" and not value:
            value = cfg.get("use_aux_norm")
        out[flag] = bool(value)
    return out


def engine_draft_class(arch: str) -> str:
    return MLA_CLASS if arch in MLA_DRAFT_ARCHS else LLAMA_CLASS


def serves_draft_class(engine: Engine, arch: str, cfg: dict | None = None) -> tuple[bool | None, str]:
    """Whether the release has a model class for this draft architecture at all. With the config,
    vLLM's rule is the release's own registry (``vllm_draft_class``)."""
    return engine.rules.serves_draft_class(engine, arch, cfg)


def mla_draft_class(engine: Engine, arch: str) -> tuple[bool | None, str]:
    """Whether the release has a model class for this draft architecture, by FIRST_MLA_DRAFT (the
    release its family's MLA draft file, ``rules.mla_draft_file``, first ships in)."""
    eng = engine
    if engine_draft_class(arch) != MLA_CLASS or eng.name not in FIRST_MLA_DRAFT:
        known = eng.name in FIRST_MLA_DRAFT
        return (True, "") if known else (None, f"{eng.name}'s draft classes are not recorded")
    first = FIRST_MLA_DRAFT[eng.name]
    if at_least(eng.effective_version, first):
        return True, f"{eng.name} has {arch} from {first}"
    return False, f"{eng} has no {arch} ({eng.name}'s {eng.rules.mla_draft_file} first ships in {first})"


def honours_flag(engine: Engine, flag: str, arch: str = SGLANG_DRAFT_ARCH,
                 speculators_format: bool = False) -> tuple[bool | None, str]:
    """(whether ``engine`` runs ``flag`` for a draft of class ``arch``, why). None: not recorded
    (TRT-LLM, an unknown engine). A release newer than the newest read is given that one's rule,
    and says so."""
    eng = engine
    cls = engine_draft_class(arch)
    rules = FLAG_FIRST.get((eng.name, cls))
    if rules is None:
        return None, f"whether {eng.name} runs {flag} is not recorded here"
    newest = FLAGS_NEWEST_READ[eng.name]
    version = eng.effective_version
    where = DRAFT_FILES[(eng.name, cls)]
    first = rules[flag]
    newer = (f" ({eng} is newer than the releases read, up to {newest}: their rule assumed)"
             if version is not None and version_key(version) > version_key(newest) else "")
    if first is None:
        return False, f"{where} does not implement {flag} in any release read (up to {newest}){newer}"
    if not at_least(version, first):
        return False, f"{where} implements {flag} from {first}; {eng} does not"
    passes = eng.rules.speculators_passes       # a mapping that drops flags on the way (vLLM's algos.py)
    if passes and speculators_format and not at_least(version, passes[flag]):
        return False, (f"vLLM's speculators config mapping (algos.py) passes {flag} on from "
                       f"{passes[flag]}; {eng} drops it before {where} sees it")
    return True, f"{where} implements {flag} from {first}{newer}"


def _later(a: str, b: str) -> str:
    return a if version_key(a) >= version_key(b) else b


def ignored_flag_problems(cfg: dict, engine: Engine) -> list[tuple[str, str, str]]:
    """(kind, message, fix) for each way ``engine`` runs this draft otherwise than it was trained:
    no class for its architecture (an MLA draft on a release before kimi_k25_eagle3.py), or a forward
    flag the draft sets that the release's draft file does not implement. norm_before_residual is
    left to its own long-standing rule (``honours_norm_before_residual``). TensorRT-LLM's draft files
    are not read: nothing is said for it."""
    eng = engine
    if not eng.rules.draft_files_read:
        return []
    arch = next(iter(architectures(cfg)), "")
    out = []
    has, why = serves_draft_class(eng, arch, cfg)
    if has is False:
        first = eng.rules.draft_class_first(arch)
        if engine_draft_class(arch) == MLA_CLASS:
            fix = f"serve with sglang>={FIRST_MLA_DRAFT['sglang']} or vllm>={FIRST_MLA_DRAFT['vllm']}"
        elif is_speculators_format(cfg):
            fix = f"serve with vllm>={VLLM_SPECULATORS_CONFIG_FIRST}"
        elif first:
            fix = f"serve with vllm>={first}"
        else:
            fix = (f"write the draft's class as {SGLANG_DRAFT_ARCH} "
                   f"(vllm>={VLLM_DRAFT_CLASS_FIRST[SGLANG_DRAFT_ARCH]})")
        out.append((ProblemKind.DRAFT_CLASS, f"{why}, so it cannot load this draft", fix))
        return out
    for flag, on in draft_flags(cfg).items():
        if not on or flag == "norm_before_residual":
            continue
        ok, why = honours_flag(eng, flag, arch, speculators_format=is_speculators_format(cfg))
        if ok is False:
            out.append((ProblemKind(flag.replace("_", "-")),
                        f"the draft was trained with {flag}=true; {why}, so {eng} runs another forward",
                        flag_fix(flag, arch, is_speculators_format(cfg))))
    return out


def flag_fix(flag: str | Sequence[str], arch: str, speculators_format: bool = False) -> str:
    """The releases that run ``flag`` (every one of several) for this draft class (FLAG_FIRST), as the
    fix for one that does not."""
    flags = [flag] if isinstance(flag, str) else list(flag)
    cls = engine_draft_class(arch)
    spec = speculators_format
    firsts = []
    for (name, c), rules in FLAG_FIRST.items():
        if c != cls or (spec and rules_of(name).reads_speculators_format is False) or not all(
                rules[f] for f in flags):
            continue
        need = [_later(rules[f], VLLM_SPECULATORS_PASSES[f]) if spec else rules[f] for f in flags]
        firsts.append(f"{name}>={max(need, key=version_key)}")
    named = ", ".join(flags)
    return (f"serve with {' or '.join(firsts)}, or retrain without {named}" if firsts
            else f"serve with an engine that implements {named} (none read does for this class), or "
                 f"retrain without {'it' if len(flags) == 1 else 'them'}")
