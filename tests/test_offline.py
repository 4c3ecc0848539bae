"""An air-gapped host: ``check`` for every engine with the network refused and an empty cache judges from the
engine's recorded rule, and its first line says so ("recorded, not read now"); nothing is fetched.

The network is refused in the child process itself (and in the pip it starts): a ``sitecustomize`` on its
PYTHONPATH makes every connection to a host other than loopback fail as an unreachable network would, and
every name lookup fail as a resolver with no network does. The packaged release matrix is what judges, as
it is for an installed wheel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAIR = REPO / "data" / "tiny-kimi"

SITECUSTOMIZE = '''
import errno, ipaddress, socket

def _loopback(host):
    try:
        return host in ("localhost",) or ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False

_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo

def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
        raise OSError(errno.ENETUNREACH, "Network is unreachable (the test refuses the network)")
    return _connect(self, address)

def getaddrinfo(host, *a, **k):
    if host is not None and not _loopback(host):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    return _getaddrinfo(host, *a, **k)

socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
'''


@pytest.fixture(scope="module")
def offline_env(tmp_path_factory) -> dict:
    site = tmp_path_factory.mktemp("offline-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), PIP_NO_CACHE_DIR="1",
               EAGLE3_WORKBOOK_INDEX_URL="https://pypi.org/simple", PIP_INDEX_URL="https://pypi.org/simple")
    return env


@pytest.mark.parametrize("engine", ["sglang==0.5.23", "vllm==0.32.0", "llamacpp==b11434", "trtllm",
                                    "lmdeploy==0.18.0"])
def test_check_judges_offline_from_the_recorded_rule(engine, offline_env, tmp_path):
    target, draft = PAIR / "target", PAIR / "draft"   # check reads configs, the record and headers only
    cache = tmp_path / "cache"
    env = {**offline_env, "EAGLE3_WORKBOOK_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "helpers", "check", "--target", str(target), "--draft",
                           str(draft), "--engine", engine, "--json"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["rule_basis"] == "recorded, not read now"
    assert report["served_layout"] is not None
    text = subprocess.run([sys.executable, "-m", "helpers", "check", "--target", str(target), "--draft",
                           str(draft), "--engine", engine], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert text.returncode == proc.returncode
    assert "its rule recorded, not read now" in text.stdout.splitlines()[0]
    assert [p for p in cache.rglob("*") if p.suffix in (".py", ".whl")] == []


def test_the_network_is_really_refused(offline_env):
    probe = ("import urllib.request\ntry:\n    urllib.request.urlopen('https://pypi.org/simple/', "
             "timeout=5)\nexcept OSError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", probe], env=offline_env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith("refused")
