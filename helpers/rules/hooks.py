"""Where the guard hooks into each engine release, found in that release's own files.

The guard runs inside the engine, on a function the engine calls at load (docs/guard.md). Whether that
function is still there, under that name, called from that place, is a fact about each release: this module
reads it from the release's files (``engines.vllm.own.release_files``, ``engines.sglang.source``), so the
release matrix (``rules.releases``) can say, release by release, which hook sites exist and which are missing
before a user's launch finds out. The vLLM plugin asks the same question of the installed release
(``v2_calls_setter``). Standard library only: it runs inside engine venvs too.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

V2_SETTER = "set_eagle3_aux_hidden_state_layers"
V2_RUNNER_FILE = "vllm/v1/worker/gpu/model_runner.py"
V2_UTILS_FILE = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
V1_RUNNER_FILE = "vllm/v1/worker/gpu_model_runner.py"
V1_SETUP = "_setup_eagle3_aux_hidden_state_outputs"
VLLM_PLUGINS_FILE = "vllm/plugins/__init__.py"
VLLM_INTERFACES_FILE = "vllm/model_executor/models/interfaces.py"


@dataclass(frozen=True)
class HookSite:
    """One place the guard needs: found (with file and line) or missing, and whether the release needs it
    at all (a runner the release does not have needs no hook)."""

    name: str
    found: bool
    where: str = ""          # file:line
    needed: bool = True

    @property
    def missing(self) -> bool:
        return self.needed and not self.found

    def as_dict(self) -> dict:
        return {"name": self.name, "found": self.found, "where": self.where, "needed": self.needed}

    @staticmethod
    def from_dict(d: dict) -> HookSite:
        return HookSite(d["name"], bool(d["found"]), d.get("where", ""), bool(d.get("needed", True)))


def _tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _def_line(tree: ast.Module | None, qualname: str) -> int | None:
    if tree is None:
        return None
    head, _, rest = qualname.partition(".")
    for node in tree.body:
        if rest and isinstance(node, ast.ClassDef) and node.name == head:
            return next((f.lineno for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                         and f.name == rest), None)
        if not rest and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == head:
            return node.lineno
    return None


def v2_calls_setter(source: str) -> int | None:
    """The line where V2's ``GPUModelRunner.load_model`` calls ``set_eagle3_aux_hidden_state_layers``, a name
    its module imports from ``eagle3_utils`` unaliased (the name the plugin wraps); None when it does not."""
    tree = ast.parse(source)
    imported = any(isinstance(n, ast.ImportFrom) and (n.module or "").endswith("eagle3_utils")
                   and any(a.name == V2_SETTER and a.asname in (None, V2_SETTER) for a in n.names)
                   for n in tree.body)
    load = [f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "GPUModelRunner"
            for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "load_model"]
    calls = [n for f in load for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == V2_SETTER]
    return calls[0].lineno if imported and calls else None


def vllm_hook_sites(root: Path) -> list[HookSite]:
    """The vLLM release under ``root``: its plugin loader, each runner's setter call the guard wraps, and the
    capture holder's setter interface."""
    out = []
    plugins = root / VLLM_PLUGINS_FILE
    text = plugins.read_text(encoding="utf-8") if plugins.is_file() else ""
    line = next((i for i, ln in enumerate(text.splitlines(), 1) if "vllm.general_plugins" in ln), None)
    out.append(HookSite("plugin entry point vllm.general_plugins", line is not None,
                        f"{VLLM_PLUGINS_FILE}:{line}" if line else ""))
    v1 = root / V1_RUNNER_FILE
    tree = _tree(v1) if v1.is_file() else None
    at = _def_line(tree, f"GPUModelRunner.{V1_SETUP}") or _def_line(tree, "GPUModelRunner.load_model")
    out.append(HookSite(f"V1 GPUModelRunner.{V1_SETUP} (or load_model)", at is not None,
                        f"{V1_RUNNER_FILE}:{at}" if at else "", needed=v1.is_file()))
    v2 = root / V2_RUNNER_FILE
    v2_eagle3 = v2.is_file() and (root / V2_UTILS_FILE).is_file()   # early V2 runners capture no aux states
    at = v2_calls_setter(v2.read_text(encoding="utf-8")) if v2.is_file() else None
    out.append(HookSite(f"V2 load_model -> {V2_SETTER} (from eagle3_utils)", at is not None,
                        f"{V2_RUNNER_FILE}:{at}" if at else "", needed=v2_eagle3))
    at = _def_line(_tree(root / V2_UTILS_FILE), "get_eagle3_aux_layers_from_config")
    out.append(HookSite("V2 get_eagle3_aux_layers_from_config", at is not None,
                        f"{V2_UTILS_FILE}:{at}" if at else "", needed=v2_eagle3))
    at = _def_line(_tree(root / VLLM_INTERFACES_FILE), "SupportsEagle3.set_aux_hidden_state_layers")
    out.append(HookSite("SupportsEagle3.set_aux_hidden_state_layers (the setter the guard probes)",
                        at is not None, f"{VLLM_INTERFACES_FILE}:{at}" if at else ""))
    return out


SGLANG_REGISTRY_FILE = "sglang/srt/models/registry.py"
SGLANG_PLUGINS_FILE = "sglang/srt/plugins/__init__.py"
SGLANG_CONTEXT_FILE = "sglang/srt/runtime_context.py"
SGLANG_ARGS_FILE = "sglang/srt/server_args.py"
SGLANG_LLAMA_FILE = "sglang/srt/models/llama.py"


def _raises_only(tree: ast.Module | None, name: str) -> bool:
    """Whether module-level function ``name`` is retired: its body (past a docstring) is a bare raise."""
    fn = next((n for n in (tree.body if tree else []) if isinstance(n, ast.FunctionDef) and n.name == name),
              None)
    body = [s for s in (fn.body if fn else [])
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return bool(body) and all(isinstance(s, ast.Raise) for s in body)


def sglang_hook_sites(root: Path) -> list[HookSite]:
    """The SGLang release under ``root``: the plugin loader (0.5.23 on; before it the registry watch of
    ``site/`` installs the guard), the registry's ``resolve_model_cls`` the hooks wrap, the setter they wrap,
    and the accessor the guard reads the draft path from."""
    out = []
    at = _def_line(_tree(root / SGLANG_PLUGINS_FILE), "load_plugins")
    out.append(HookSite("plugin loader sglang.srt.plugins.load_plugins (else the site/ registry watch)",
                        at is not None, f"{SGLANG_PLUGINS_FILE}:{at}" if at else "", needed=False))
    at = _def_line(_tree(root / SGLANG_REGISTRY_FILE), "_ModelRegistry.resolve_model_cls")
    out.append(HookSite("_ModelRegistry.resolve_model_cls", at is not None,
                        f"{SGLANG_REGISTRY_FILE}:{at}" if at else ""))
    at = _def_line(_tree(root / SGLANG_LLAMA_FILE), "LlamaForCausalLM.set_eagle3_layers_to_capture")
    out.append(HookSite("LlamaForCausalLM.set_eagle3_layers_to_capture", at is not None,
                        f"{SGLANG_LLAMA_FILE}:{at}" if at else ""))
    ctx = _def_line(_tree(root / SGLANG_CONTEXT_FILE), "get_server_args")
    args_tree = _tree(root / SGLANG_ARGS_FILE)
    legacy = _def_line(args_tree, "get_global_server_args")
    legacy = None if legacy is not None and _raises_only(args_tree, "get_global_server_args") else legacy
    where = f"{SGLANG_CONTEXT_FILE}:{ctx}" if ctx else (f"{SGLANG_ARGS_FILE}:{legacy}" if legacy else "")
    out.append(HookSite("server args accessor (runtime_context.get_server_args or get_global_server_args)",
                        bool(where), where))
    return out
