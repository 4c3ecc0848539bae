"""What ``check`` reads from a draft's own files without loading a weight: the safetensors headers' shapes,
and the problems they and the config show for one engine release (the fc's width against the ids it is
fed, the forward flags the release's draft ignores, the class SGLang registers, the vocabulary map).
Each check adds its problems and notes to the ``gate.CheckReport`` it is handed."""
from __future__ import annotations

from pathlib import Path

from ..boundaries import Problem, ProblemKind, WiringResult
from ..engines.sglang import source as ss
from ..engines.sglang.classes import entry_class_index
from ..errors import safetensors_shapes_of
from ..rules.conventions import (
    MLA_DRAFT_ARCH,
    SGLANG_DRAFT_ARCH,
    Engine,
    TargetSpec,
    architectures,
    engine_fc_slots,
    is_eagle_reference_config,
    is_speculators_format,
)
from ..rules.flags import honours_norm_before_residual, ignored_flag_problems, sets_norm_before_residual


def safetensors_shapes(folder: Path) -> dict[str, list[int]] | None:
    """name -> shape from every safetensors header in ``folder`` (None when it ships none), each file read
    through ``errors.safetensors_shapes_of``: a truncated or corrupt file is a BadCheckpoint naming it."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for f in files:
        shapes.update(safetensors_shapes_of(f))
    return shapes


def fc_in(shapes: dict[str, list[int]]) -> tuple[str, int] | None:
    for name, shape in shapes.items():
        if name.split(".")[-2:] == ["fc", "weight"] and len(shape) == 2:
            return name, shape[1]
    return None


def fc_slots(shapes, spec: TargetSpec) -> int | None:
    fc = fc_in(shapes) if shapes else None
    h = spec.hidden_size
    if fc is None or h is None or fc[1] % h:
        return None
    return fc[1] // h


def fc_width(report, cfg: dict, shapes, spec: TargetSpec, engine: Engine,
              served: WiringResult) -> None:
    if shapes is None:
        report.notes.append("no safetensors in the draft folder: fc width not checked (a .bin cannot be read "
                            "without loading it)")
        # the engine sizes fc from the config and feeds what it captures: the two can disagree on their own
        built, rule = engine_fc_slots(cfg, engine)
        fed = len(served.served_layout)
        if built is not None and fed and fed != built and not served.errors:
            report.problems.append(Problem(
                ProblemKind.FC_WIDTH,
                f"{report.engine} builds fc for {built} states ({rule}) but feeds it {fed} "
                f"({tuple(served.served_layout)}): the first draft forward fails on the shape",
                f"give the engine {built} ids where it reads them (vLLM: top level; SGLang: eagle_config)"))
        return
    fc = fc_in(shapes)
    h = spec.hidden_size
    if fc is None or h is None:
        report.notes.append("fc width not checked (no fc.weight in the headers, "
                            "or no hidden_size in the target)")
        return
    name, width = fc
    if width % h:
        report.problems.append(Problem(
            ProblemKind.FC_WIDTH,
            f"{name} takes {width} inputs, not a multiple of the target's hidden_size {h}: this draft "
            f"was trained for another target", "retrain (or pair it with the target it was trained for)"))
        return
    k = width // h
    built, rule = engine_fc_slots(cfg, engine)
    if built is None:
        report.notes.append(f"fc is {k} states wide; {rule}")
    elif built != k:
        report.problems.append(Problem(
            ProblemKind.FC_WIDTH,
            f"{report.engine} builds fc for {built} states ({rule}) but {name} is {width} = {k} x {h} "
            f"wide: loading the weights fails", f"set num_aux_hidden_states = {k} in the draft config"))
    if served.served_layout and len(served.served_layout) != k and not served.errors:
        report.problems.append(Problem(
            ProblemKind.FC_WIDTH, f"{report.engine} feeds {len(served.served_layout)} states, fc takes {k}",
            f"give {k} ids"))


def forward_flags(report, cfg: dict, engine: Engine) -> None:
    rules = engine.rules
    if rules.reads_speculators_format is False and is_speculators_format(cfg):
        archs = ", ".join(architectures(cfg) or ("no architectures",))
        report.problems.append(Problem(
            ProblemKind.SPECULATORS_FORMAT, f"speculators-format draft ({archs}): "
            "SGLang registers no such architecture in the releases read so far; "
            "its llama_eagle3 would skip layers.0.* weights silently",
            "convert it: architectures LlamaForCausalLMEagle3, the ids under eagle_config in SGLang's "
            "numbering (its setter's inverse, not the top-level ids copied), weights layers.0.* renamed "
            "midlayer.*"))
    if is_eagle_reference_config(cfg):
        archs = ", ".join(architectures(cfg))
        head = f"the EAGLE reference code's head ({archs} with a draft_vocab_size)"
        if rules.builds_reference_head is False:
            report.problems.append(Problem(
                ProblemKind.DRAFT_CLASS,
                f"{head}: SGLang builds the draft from architectures[0] as written (configs/model_config.py "
                f"renames only MTP classes), i.e. a plain {archs} whose load_weights skips the names it has "
                f"no parameter for: fc.* and midlayer.* never load and the aux states are never read",
                "set architectures to [\"LlamaForCausalLMEagle3\"] in the draft's config.json (the weights "
                "already carry SGLang's fc.* / midlayer.* names)"))
        elif rules.builds_reference_head:
            report.notes.append(f"{head}: vLLM's EAGLEConfig renames it Eagle3{archs.split(',')[0]}, "
                                f"which its registry must hold (conventions.VLLM_DRAFT_CLASS_FIRST)")
        else:
            report.notes.append(f"{head}: whether {engine.name} loads this class as an EAGLE-3 head is not "
                                f"recorded here")
    if sets_norm_before_residual(cfg) and honours_norm_before_residual(engine) is False:
        report.problems.append(Problem(
            ProblemKind.NORM_BEFORE_RESIDUAL,
            f"the draft was trained with norm_before_residual=true; {report.engine}'s "
            f"llama_eagle3 ignores the flag and runs another forward",
            "serve with vLLM, or retrain without it"))
    for kind, message, fix in ignored_flag_problems(cfg, engine):  # MLA class, EAGLE 3.1 flags (conventions)
        report.problems.append(Problem(kind, message, fix))


def sglang_draft_class(report, cfg: dict, eng: Engine, root) -> None:
    """SGLang builds the draft from architectures[0] and refuses a name no model file registers
    (vLLM's Eagle3LlamaForCausalLM, say), read from the release's own EntryClass lists."""
    if not eng.rules.runs_release_source or any(
            p.kind in (ProblemKind.DRAFT_CLASS, ProblemKind.SPECULATORS_FORMAT) for p in report.problems):
        return
    arch = next(iter(architectures(cfg)), "")
    try:
        source = ss.get_source(eng.version, root=root) if root is not None or eng.version else None
    except (ss.SglangSourceError, OSError, ValueError):
        source = None
    if source is None or not arch:
        return
    registered = entry_class_index(source)
    if arch in registered:
        return
    drafts = sorted(a for a in registered if "eagle3" in a.lower())
    want = MLA_DRAFT_ARCH if cfg.get("kv_lora_rank") else SGLANG_DRAFT_ARCH   # MLA drafts carry the latent
    report.problems.append(Problem(
        ProblemKind.DRAFT_CLASS,
        f"{report.engine} registers no model class named {arch} (its EAGLE-3 draft classes: "
        f"{', '.join(drafts) or 'none'}): models/registry.py falls back to the Transformers backend, which "
        f"has no EAGLE-3 head, or refuses the name",
        f"write architectures as [\"{want}\"] in the draft's config.json (the weights need no change "
        f"when they use SGLang's fc.* / midlayer.* names)"))


def vocab(report, cfg: dict, shapes, spec: TargetSpec) -> None:
    layer = (cfg.get("transformer_layer_config")
             if isinstance(cfg.get("transformer_layer_config"), dict) else {})
    draft_vocab = cfg.get("draft_vocab_size") or layer.get("draft_vocab_size")
    vocab = spec.vocab_size
    if (not (isinstance(draft_vocab, int) and isinstance(vocab, int) and draft_vocab < vocab)
            or shapes is None):
        return
    if "d2t" not in shapes:
        report.problems.append(Problem(
            ProblemKind.VOCAB,
            f"reduced draft vocabulary ({draft_vocab} of {vocab}) but no d2t tensor: the engine cannot map "
            f"draft tokens to target tokens, so nearly every draft token is rejected",
            "add d2t (target_id - draft_id for each draft token) from the trainer's vocabulary mapping"))
