"""The live SGLang backend, checked against SGLang's own source and a fake server.

Flag and field names are checked against the real sglang wheels (downloaded once with pip
and cached in pytest's cache), because a renamed flag would only show up on a GPU host,
where a failed launch costs minutes. The lifecycle runs against a tiny stdlib HTTP server
that mimics SGLang's routes and, like SGLang, forks a worker, so we can see that the whole
process group is gone on every way out.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from conftest import scaled

from helpers.engines.sglang import server as ss
from helpers.investigation.prompts import read_prompts

VERSIONS = ("0.5.9", "0.5.23")
REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- real sglang source


def _download_wheel(version: str, dest: Path) -> Path | None:
    found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
            "-d", str(dest), f"sglang=={version}"]
    # 0.5.23 ships CPython/manylinux wheels only; ask for that platform if ours differs.
    platform = ["--python-version", "3.11", "--platform", "manylinux_2_34_x86_64"]
    for cmd in (base, base + platform):
        try:
            subprocess.run(cmd, capture_output=True, timeout=240, check=False)
        except subprocess.TimeoutExpired:
            return None
        found = sorted(dest.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="session", params=VERSIONS)
def sglang_wheel(request) -> zipfile.ZipFile:
    dest = Path(os.environ.get("SGLANG_WHEEL_DIR") or request.config.cache.mkdir("sglang-wheels"))
    wheel = _download_wheel(request.param, dest)
    if wheel is None:
        pytest.skip(f"could not download sglang=={request.param} from PyPI (offline?)")
    with zipfile.ZipFile(wheel) as zf:
        yield zf


def _sources(zf: zipfile.ZipFile, prefix: str) -> dict[str, str]:
    return {n: zf.read(n).decode() for n in zf.namelist() if n.startswith(prefix) and n.endswith(".py")}


def _cli_flags(zf: zipfile.ZipFile) -> set[str]:
    """Every flag the server's argparse can know: literal '--x' strings (0.5.9 style) plus,
    for 0.5.23, flags generated from annotated dataclass fields ``name: A[...]``."""
    files = _sources(zf, "sglang/srt/server_args.py") | _sources(zf, "sglang/srt/arg_groups/")
    flags = set()
    for name, text in files.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.fullmatch(r"--[a-z0-9-]+", node.value)):
                flags.add(node.value)
            if (
                "/fields/" in name and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(node.annotation, ast.Subscript)
                and getattr(node.annotation.value, "id", None) == "A"
                and "no_cli=True" not in ast.unparse(node.annotation)
            ):
                flags.add("--" + node.target.id.replace("_", "-"))
    return flags


def _full_spec() -> ss.ServerSpec:
    return ss.ServerSpec(target="/m/target", draft="/m/draft", port=31234, steps=5, topk=1,
                         tp_size=2, mem_fraction=0.7)


def test_every_emitted_flag_exists_in_sglang(sglang_wheel):
    known = _cli_flags(sglang_wheel)
    assert "--model-path" in known and len(known) > 100, "flag extraction found too little"
    for speculative in (False, True):
        emitted = [a for a in ss.build_launch_command(_full_spec(), speculative) if a.startswith("--")]
        missing = [f for f in emitted if f not in known]
        assert not missing, f"flags not in sglang source: {missing}"
    assert "sglang/launch_server.py" in sglang_wheel.namelist()  # the -m target


def test_eagle3_is_a_known_algorithm(sglang_wheel):
    files = (_sources(sglang_wheel, "sglang/srt/server_args.py")
             | _sources(sglang_wheel, "sglang/srt/arg_groups/fields/spec.py"))
    assert any("EAGLE3" in t and "speculative" in t for t in files.values())


def test_response_field_names_exist_in_sglang(sglang_wheel):
    tm = sglang_wheel.read("sglang/srt/managers/tokenizer_manager.py").decode()
    for key in ("prompt_tokens", "completion_tokens"):
        assert f'"{key}"' in tm
    for key in ("spec_verify_ct", "spec_accept_length", "e2e_latency"):
        assert f'meta_info["{key}"]' in tm
    # SGLang's accept length is completion tokens per verify step (bonus token included).
    assert "recv_obj.completion_tokens[i] / recv_obj.spec_verify_ct[i]" in " ".join(tm.split())
    managers = _sources(sglang_wheel, "sglang/srt/managers/")
    assert any('["avg_spec_accept_length"]' in t for t in managers.values())
    http = sglang_wheel.read("sglang/srt/entrypoints/http_server.py").decode()
    assert '"internal_states": internal_states' in http
    for route in ("/health", ss.HEALTH_PATH, *ss.SERVER_INFO_PATHS):
        assert f'@app.get("{route}")' in http
    assert re.search(r'api_route\(\s*"/generate"', http)


# --------------------------------------------------------------------------- command building


def test_speculative_command():
    cmd = ss.build_launch_command(ss.ServerSpec(target="T", draft="D", port=30001, python="/py", steps=3))
    assert cmd[:3] == ["/py", "-m", "sglang.launch_server"]
    pairs = dict(zip(cmd[3::2], cmd[4::2]))
    assert pairs["--model-path"] == "T" and pairs["--speculative-draft-model-path"] == "D"
    assert pairs["--speculative-algorithm"] == "EAGLE3"
    assert pairs["--speculative-num-steps"] == "3" and pairs["--speculative-eagle-topk"] == "1"
    assert pairs["--speculative-num-draft-tokens"] == "4"  # steps + 1 for a top-1 chain
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "30001"


def test_baseline_is_speculative_minus_draft_flags():
    spec = ss.ServerSpec(target="T", draft="D", extra_args=("--trust-remote-code",), mem_fraction=0.5)
    base, spec_cmd = ss.build_launch_command(spec, False), ss.build_launch_command(spec, True)
    assert not any(a.startswith("--speculative") for a in base)
    assert [a for a in spec_cmd if a not in base] and all(a in spec_cmd for a in base)
    assert base[-1] == spec_cmd[-1] == "--trust-remote-code"


def test_spec_validation():
    with pytest.raises(ValueError, match="draft"):
        ss.build_launch_command(ss.ServerSpec(target="T"), speculative=True)
    with pytest.raises(ValueError, match="loopback"):
        ss.ServerSpec(target="T", host="0.0.0.0")
    assert ss.ServerSpec(target="T", draft_tokens=8).num_draft_tokens == 8


def test_python_from_env(monkeypatch):
    monkeypatch.setenv("SGLANG_PYTHON", "/opt/sgl/bin/python")
    assert ss.ServerSpec(target="T").python == "/opt/sgl/bin/python"


# --------------------------------------------------------------------------- response parsing

# Shapes as SGLang 0.5.9 returns them (keys checked above against tokenizer_manager.py).
SERVER_INFO = {
    "model_path": "/m/target", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
    "internal_states": [{"attention_backend": "fa3", "avg_spec_accept_length": 2.5},
                        {"attention_backend": "fa3", "avg_spec_accept_length": 3.5}],
    "version": "0.5.9",
}


def test_parse_server_info():
    info = ss.parse_server_info(SERVER_INFO)
    assert info.avg_spec_accept_length == pytest.approx(3.0) and info.speculative_algorithm == "EAGLE3"
    assert ss.parse_server_info({"internal_states": [{}]}).avg_spec_accept_length is None


def test_load_prompts(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "id": 1}\n\n{"prompt": "b"}\n')
    (tmp_path / "p.txt").write_text("one\ntwo\n")
    assert read_prompts(tmp_path / "p.jsonl") == ["a", "b"]
    assert read_prompts(tmp_path / "p.txt") == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="prompt"):
        read_prompts(tmp_path / "bad.jsonl")


# --------------------------------------------------------------------------- lifecycle, fake server

FAKE_SERVER = textwrap.dedent('''
    import json, math, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port, pid_file, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if "ignore-term" in mode:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "shm" in mode:
        # what SGLang 0.5.23 leaves when its group is killed: a load-snapshot slot file and a semaphore,
        # held open until the kill
        shm = [open(f"/dev/shm/{n}{port}", "w") for n in ("sglang_loads_fake_", "sem.mp-fake")]
        open(pid_file + ".shm", "w").write(json.dumps([f.name for f in shm]))
    # Like SGLang's scheduler: a worker process in the same process group.
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(pid_file, "w").write(json.dumps([worker.pid]))
    print("fake sglang starting", flush=True)
    time.sleep(0.2)

    class H(BaseHTTPRequestHandler):
        def _send(self, code, obj=None):
            body = json.dumps(obj).encode() if obj is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                return self._send(200)
            if self.path == "/server_info" and "old" not in mode:
                return self._send(200, {"version": "fake", "speculative_algorithm": "EAGLE3",
                                        "internal_states": [{"avg_spec_accept_length": 2.5}]})
            if self.path == "/get_server_info":
                return self._send(200, {"version": "old",
                                        "internal_states": [{"avg_spec_accept_length": 1.5}]})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = req["sampling_params"]["max_new_tokens"]
            assert req["sampling_params"]["temperature"] == 0
            meta = {"prompt_tokens": len(req["text"].split()), "completion_tokens": n,
                    "spec_verify_ct": math.ceil(n / 2.5), "spec_accept_length": n / math.ceil(n / 2.5),
                    "e2e_latency": 0.01, "finish_reason": {"type": "length", "length": n}}
            self._send(200, {"text": "y" * n, "meta_info": meta})

        def log_message(self, *a):
            pass

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def _alive(pid: int) -> bool:
    st = ss._proc_state(pid)
    if st is not None:
        return st[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def fake(tmp_path):
    """Returns make(mode) -> (spec, pid_file) for a fake server on a free loopback port."""
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SERVER)

    def make(mode="normal"):
        port = ss.find_free_port()
        pid_file = tmp_path / f"pids-{port}.json"
        cmd = [sys.executable, str(script), str(port), str(pid_file), mode]
        return ss.ServerSpec(target="unused", port=port, command=cmd), pid_file

    return make


def _start(spec, tmp_path, **kw):
    kw.setdefault("poll_interval", 0.1)
    kw.setdefault("grace_s", scaled(3.0))
    kw.setdefault("startup_timeout", scaled(15))
    return ss.SGLangServer(spec, log_path=tmp_path / f"{spec.port}.log", **kw)


def _all_gone(leader: int, pid_file: Path) -> bool:
    workers = json.loads(pid_file.read_text()) if pid_file.exists() else []
    deadline = time.monotonic() + scaled(2)
    while time.monotonic() < deadline and any(_alive(p) for p in [leader, *workers]):
        time.sleep(0.05)
    return not any(_alive(p) for p in [leader, *workers])


def test_lifecycle_normal_exit(fake, tmp_path):
    spec, pid_file = fake()
    with _start(spec, tmp_path) as server:
        leader = server.proc.pid
        body = ss.http_json(server.base_url + "/generate",
                            {"text": "a b c", "sampling_params": {"max_new_tokens": 10, "temperature": 0}})
        info = ss.read_server_info(server.base_url)
    assert server.proc is None and _all_gone(leader, pid_file)
    assert body["meta_info"]["completion_tokens"] == 10 and body["meta_info"]["prompt_tokens"] == 3
    assert info.avg_spec_accept_length == pytest.approx(2.5) and info.version == "fake"
    assert "fake sglang starting" in server.log_tail()


def test_lifecycle_exception_inside_block(fake, tmp_path):
    spec, pid_file = fake("old")
    with pytest.raises(KeyError):
        with _start(spec, tmp_path) as server:
            leader = server.proc.pid
            # Old servers only know /get_server_info; the reader falls back to it.
            assert ss.read_server_info(server.base_url).avg_spec_accept_length == pytest.approx(1.5)
            raise KeyError("boom")
    assert _all_gone(leader, pid_file)


def test_sigterm_ignored_escalates_to_kill(fake, tmp_path):
    spec, pid_file = fake("ignore-term")
    server = _start(spec, tmp_path, grace_s=0.5).start()
    leader = server.proc.pid
    t0 = time.monotonic()
    server.stop()
    server.stop()  # idempotent
    assert time.monotonic() - t0 < 5 and _all_gone(leader, pid_file)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this host")
def test_a_killed_server_leaves_nothing_in_dev_shm(fake, tmp_path):
    """Killed after its grace period, the group runs none of its own unlinks: what it made in /dev/shm is
    removed once it is gone; what was there before it, and what a live process holds, stay."""
    spec, pid_file = fake("ignore-term shm")
    kept = Path(f"/dev/shm/sglang_loads_test_kept_{os.getpid()}")
    server, holder = _start(spec, tmp_path, grace_s=0.5).start(), None
    try:                                  # the server and the holder are stopped on every path
        deadline = time.monotonic() + scaled(5)
        while not Path(f"{pid_file}.shm").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        made = [Path(p) for p in json.loads(Path(f"{pid_file}.shm").read_text())]
        # made while the server ran, by a process outside its group that is still alive at the stop
        hold = f"f = open({str(kept)!r}, 'w'); print(1, flush=True); import time; time.sleep(60)"
        holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "1"
        assert all(p.exists() for p in made)
        server.stop()
        assert not any(p.exists() for p in made), made
        assert kept.exists()
    finally:
        server.stop()
        if holder is not None:
            holder.kill()
            holder.wait()
        kept.unlink(missing_ok=True)


def test_early_crash_raises_with_log_tail(tmp_path):
    crash = [sys.executable, "-c",
             "import sys; print('Loading safetensors checkpoint shards'); "
             "print('RuntimeError: CUDA error: no kernel image is available', file=sys.stderr); sys.exit(3)"]
    spec = ss.ServerSpec(target="unused", port=ss.find_free_port(), command=crash)
    with pytest.raises(ss.ServerStartError) as err:
        _start(spec, tmp_path).start()
    msg = str(err.value)
    assert ("exited with code 3" in msg and "no kernel image is available" in msg
            and "checkpoint shards" in msg)


def test_startup_timeout_stops_server(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('compiling', flush=True); time.sleep(60)"]
    spec = ss.ServerSpec(target="unused", port=ss.find_free_port(), command=cmd)
    server = _start(spec, tmp_path, startup_timeout=scaled(1.0))
    with pytest.raises(ss.ServerStartError, match="not healthy") as err:
        server.start()
    assert "compiling" in str(err.value) and server.proc is None


def test_atexit_stops_a_server_left_running(fake, tmp_path):
    spec, pid_file = fake()
    leader_file = tmp_path / "leader"
    script = textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from helpers.engines.sglang import server as ss
        spec = ss.ServerSpec(target="unused", port={spec.port}, command={spec.command!r})
        server = ss.SGLangServer(spec, poll_interval=0.1, grace_s={scaled(3.0)}, startup_timeout={scaled(15)})
        server.start()
        open({str(leader_file)!r}, "w").write(str(server.proc.pid))
    ''')
    subprocess.run([sys.executable, "-c", script], check=True, timeout=scaled(30))
    assert _all_gone(int(leader_file.read_text()), pid_file)


# --------------------------------------------------------------------------- availability and CLI


def _fake_python(tmp_path, probe: dict) -> str:
    path = tmp_path / "fakepython"
    path.write_text(f"#!/bin/sh\necho 'PROBE{json.dumps(probe)}'\n")
    path.chmod(0o755)
    return str(path)
