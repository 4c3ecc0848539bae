"""Where SGLang lives: ``.venv-sglang``, set up by ``bash workbook.sh`` beside ``.venv``.

SGLang pins its own transformers (0.5.23: 5.19) and a CUDA torch, so it cannot share the notebooks'
venv; the workbook talks to it only through its server process (``helpers.engines.sglang.engine``). This
module answers, without starting Python in that venv (importing sglang takes seconds), whether it is there,
which release, and for which device: on a CPU host the workbook's accommodations
(``helpers.engines.sglang.cpu``) apply, and they are pinned to one release. A host without it gets
``EngineUnavailable``: one line saying what is missing and the command that installs it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...rules.conventions import Engine

ROOT = Path(__file__).resolve().parents[3]
VENV_ENV = "EAGLE3_WORKBOOK_SGLANG_VENV"
SETUP_HINT = "bash workbook.sh sglang (or run/test, which set it up first)"
LOG_NAME = ".venv-sglang.install.log"


class EngineUnavailable(InputError):
    """No runnable SGLang on this host: said in one line, never a traceback."""


@dataclass(frozen=True)
class SglangInstall:
    venv: Path
    python: Path
    version: str             # the release, e.g. '0.5.23'
    torch: str               # the torch build in that venv, e.g. '2.13.0+cpu'
    project: bool            # this project is installed there (the CPU hooks import helpers)
    plugins: bool = False    # the release has SGLang's plugin framework (sglang/srt/plugins/, 0.5.23 on)

    @property
    def device(self) -> str:
        """cpu when the venv's torch is a CPU build (what requirements-sglang-cpu.txt installs)."""
        forced = os.environ.get("EAGLE3_WORKBOOK_SGLANG_DEVICE") == "cpu"
        return "cpu" if self.torch.endswith("+cpu") or forced else "cuda"

    @property
    def engine(self) -> Engine:
        """The engine whose rules a live run is held to: this release, running."""
        return Engine("sglang", self.version, live=True, runtime=self.version)


def venv_path() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".venv-sglang").expanduser()


def _dist_version(sites: list[Path], name: str) -> str | None:
    for site in sites:
        for d in site.glob(f"{name}-*.dist-info"):
            m = re.fullmatch(rf"{name}-([0-9][^-]*)\.dist-info", d.name)
            if m:
                return m.group(1)
    return None


def find_sglang(venv: Path | None = None) -> SglangInstall:
    venv = Path(venv) if venv is not None else venv_path()
    python = venv / "bin" / "python"
    log = venv.parent / (venv.name + ".install.log")
    if not python.exists():
        raise EngineUnavailable(f"no SGLang venv at {venv} (no bin/python); set it up with {SETUP_HINT}"
                                + (f"; the last setup's log: {log}" if log.is_file() else ""))
    sites = sorted(venv.glob("lib/python*/site-packages"))
    version = _dist_version(sites, "sglang")
    if version is None:
        raise EngineUnavailable(f"{venv} has no sglang installed; set it up with {SETUP_HINT}"
                                + (f"; the last setup's log: {log}" if log.is_file() else ""))
    torch_version = _dist_version(sites, "torch") or "unknown"
    project = any(sites[0].glob("eagle3_wiring_workbook-*.dist-info")) if sites else False
    plugins = any((s / "sglang" / "srt" / "plugins" / "hook_registry.py").is_file() for s in sites)
    return SglangInstall(venv, python, version, torch_version, project, plugins)
