"""Error kinds every command turns into one line and exit status 2, and strict JSON output.

A user's bad input (a path, a checkpoint, a config, a text file, an option) must end in one
line that names what was expected and what came, and must change nothing. Each kind of input
has its own exception type so a command can catch them all in one place.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
import sys
import time
from pathlib import Path


class InputError(ValueError):
    """Bad input of any kind; the message is the whole story, said in one line."""


class BadCheckpoint(InputError):
    """Weights that cannot be read, or that hold numbers that cannot be trusted."""


class BadConfig(InputError):
    """A config file that is not JSON, or lacks what it must say."""


class BadText(InputError):
    """A text, prompts or data file that cannot be read as what it claims to be."""


class BadOption(InputError):
    """A command-line option or notebook parameter out of range."""


def finite_or_none(obj):
    """The same structure with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def strict_json(obj, **kw) -> str:
    """``json.dumps`` that never writes the bare ``NaN``/``Infinity`` strict parsers reject."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kw)


class CacheError(InputError):
    """The engine-source cache folder cannot be created or written: a setting the user chose
    (``EAGLE3_WORKBOOK_CACHE``) or a home folder they cannot write, never a reason to guess."""


class NonFiniteResult(InputError):
    """A score or accept length came out NaN/Inf: the inputs (weights, features) cannot be trusted."""


# --------------------------------------------------------------------------------------
# Turning errors into one line, and saying fallbacks out loud.


def one_line(exc: BaseException | str) -> str:
    """The message on one line: a multi-line message would be cut by whoever reads only the
    first line (CI logs, the report index), so the lines are joined rather than dropped."""
    text = str(exc).strip() if not isinstance(exc, str) else exc.strip()
    if not text and isinstance(exc, BaseException):
        text = type(exc).__name__
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def close_progress_bars() -> None:
    """Close every live tqdm bar, which ends its line: a message printed while a bar is drawn would
    be glued onto the bar's line, and the bar redrawn after it. A bar whose loop an exception left
    is still open when the error is reported (its frame is held by the traceback)."""
    std = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(std, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:  # a half-built bar: nothing of it is on screen
            pass


def pickle_refusal(exc: BaseException) -> str:
    """What a ``weights_only`` load refused, in a few words: torch's own message is a paragraph, and the
    fact a user needs is the global the pickle asked for (e.g. ``posix.system``)."""
    # torch 2.13: "Trying to load unsupported GLOBAL posix.system whose module posix is blocked";
    # earlier releases: "Unsupported global: GLOBAL posix.system was not an allowed global"
    m = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", str(exc))
    if m:
        return f"it asks for {m.group(1)}, which a weights-only load refuses"
    m = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", str(exc))
    if m:       # an opcode or type the weights-only unpickler does not take (a raw pickle, protocol 4+)
        return f"a weights-only load refuses it: {m.group(1).strip()}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first if len(first) <= 120 else first[:117].rsplit(" ", 1)[0] + " ..."


def say(line: str) -> None:
    """One line on stderr, starting on a line of its own."""
    close_progress_bars()
    print(line, file=sys.stderr)


# Set by the command line when ``--json`` was asked for: an error is then a JSON document on stdout too,
# so a program reading the output gets one to parse (the line on stderr stays for people).
JSON_ERRORS = False


def fail(exc: BaseException | str, code: int = 2) -> int:
    """Print ``error: <one line>`` on stderr and hand back the exit status for the CLI to return. What a
    command said on a held stderr before it (``HeldStderr``) is dropped: the error is the only line.
    With ``--json``, ``{"error": ..., "exit_code": ...}`` on stdout as well."""
    close_progress_bars()          # first: a closing bar writes its last frame, which the drop then takes
    if isinstance(sys.stderr, HeldStderr):
        sys.stderr.drop()
    say(f"error: {one_line(exc)}")
    if JSON_ERRORS:
        import json

        print(json.dumps({"error": one_line(exc), "exit_code": code}))
    return code


class HeldStderr:
    """stderr for a command whose stderr is a file or a pipe (a log, a script, CI): what it writes in its
    first ``hold_s`` seconds is held, then passed on as it comes. A command that fails on bad input does
    so in those seconds (its inputs are checked before any model loads), and ``fail`` drops what was held,
    so the error line is all a reader of the log gets; a command that runs on sees its warnings and
    progress late by at most ``hold_s``. A terminal is never held: a person sees bars live."""

    def __init__(self, stream, hold_s: float = 10.0, clock=None):
        self._stream, self._clock = stream, clock or time.monotonic
        self._until = self._clock() + hold_s
        self._held: list[str] = []

    def write(self, text: str) -> int:
        if self._held is not None and self._clock() < self._until:
            self._held.append(text)
            return len(text)
        self.release()
        return self._stream.write(text)

    def release(self) -> None:
        """Pass on what was held; from now on everything goes straight through."""
        if self._held:
            self._stream.write("".join(self._held))
        self._held = None
        self._stream.flush()

    def drop(self) -> None:
        if self._held is not None:
            self._held = []

    def flush(self) -> None:
        if self._held is None:
            self._stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):          # encoding, fileno, ...: the stream's own
        return getattr(self._stream, name)


_said: set[str] = set()


def warn_once(message: str) -> str:
    """One ``warning:`` line on stderr per distinct message per process: a fallback that is
    resolved for several plans in one command must still be said, but said once."""
    line = one_line(message)
    if line not in _said:
        _said.add(line)
        print(f"warning: {line}", file=sys.stderr)
    return line


def print_json(obj, **kw) -> None:
    """Every ``--json`` goes through here, so none of them can print a bare NaN."""
    print(strict_json(obj, **kw))


# --------------------------------------------------------------------------------------
# Reading user files with the file named in every failure.


def read_text_file(path, what: str = "text file") -> str:
    """UTF-8 text or a BadText naming the file and the byte where decoding stopped."""
    path = Path(path)
    if not path.is_file():
        raise BadText(f"no {what} at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BadText(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                      f"expected a UTF-8 {what}") from None
    except OSError as exc:
        raise BadText(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_json_file(path, what: str = "config") -> object:
    """Parsed JSON or a BadConfig naming the file, line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadConfig(f"no {what} at {path}") from None
    except UnicodeDecodeError as exc:
        raise BadConfig(f"{path} is not UTF-8 JSON (byte offset {exc.start}); expected a {what} in "
                        f"JSON") from None
    except OSError as exc:
        raise BadConfig(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadConfig(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                        f"expected a {what} in JSON") from None
    except RecursionError:
        raise BadConfig(f"{path} nests its JSON too deeply to read (thousands of levels); expected a {what} "
                        f"in JSON") from None


def _dtype_bits(dtype: str) -> int:
    """Bits per element of a safetensors dtype name (``F32``, ``BF16``, ``F8_E4M3``, ``F4``, ``BOOL``)."""
    m = re.match(r"[A-Z]+?(\d+)", dtype)
    return int(m.group(1)) if m else 8


def safetensors_shapes_of(f) -> dict[str, list[int]]:
    """name -> shape from one safetensors file's header, read through the safetensors library (no weight
    is loaded), or a BadCheckpoint naming the file: one that does not parse, or whose tensors do not end
    where the file ends (a truncated or partly copied file whose header survived)."""
    from safetensors import safe_open

    f = Path(f)
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
        with safe_open(str(f), framework="numpy") as st:
            slices = {name: st.get_slice(name) for name in st.keys()}
            shapes = {name: list(s.get_shape()) for name, s in slices.items()}
            data = sum((math.prod(shape) * _dtype_bits(slices[name].get_dtype()) + 7) // 8
                       for name, shape in shapes.items())
    except OSError as exc:
        raise BadCheckpoint(f"cannot read {f}: {exc.strerror or exc}; expected a safetensors file") from None
    except Exception as exc:  # safetensors' SafetensorError derives from Exception only
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise BadCheckpoint(f"{f} is not a readable safetensors file ({detail}; the file has {size} bytes); "
                            f"expected a complete safetensors file as published (truncated or partly "
                            f"copied?)") from None
    n = int.from_bytes(head, "little")
    if data != size - 8 - n:
        raise BadCheckpoint(f"{f} is not a readable safetensors file: its header ({n} bytes) says its "
                            f"tensors end at byte {8 + n + data}, the file has {size} bytes; expected a "
                            f"complete safetensors file as published (truncated or partly copied?)")
    return shapes


def check_architectures(cfg: dict, path) -> None:
    """``architectures`` is a list of class names in every Hugging Face config; a bare string would
    otherwise be indexed letter by letter (its first character taken for the class)."""
    archs = cfg.get("architectures")
    if archs is None or (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        return
    raise BadConfig(f"{path}: \"architectures\" is {json.dumps(archs)[:80]}; expected a list of class names, "
                    f"e.g. [\"DeepseekV3ForCausalLM\"]")


# --------------------------------------------------------------------------------------
# Numbers that cannot be trusted.


def nonfinite_tensors(named) -> list[tuple[str, int, int]]:
    """(name, non-finite count, numel) for every floating tensor of ``named`` holding NaN or Inf."""
    import torch

    bad = []
    for name, t in named:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            n = int((~torch.isfinite(t)).sum())
            if n:
                bad.append((name, n, t.numel()))
    return bad


def check_finite_weights(named, source) -> None:
    """BadCheckpoint naming every tensor with NaN/Inf and how many: a draft or target with such
    weights still runs and produces confident-looking, meaningless rankings."""
    bad = nonfinite_tensors(named)
    if bad:
        listed = ", ".join(f"{name} ({n} of {total})" for name, n, total in bad[:5])
        more = f" and {len(bad) - 5} more tensors" if len(bad) > 5 else ""
        raise BadCheckpoint(f"{source} holds non-finite weights (NaN or Inf): {listed}{more}; expected "
                            f"finite numbers everywhere (a diverged or corrupted training run?)")


def check_finite(what: str, *values) -> None:
    """InputError when a result that a report will print is NaN or infinite: such a number would
    otherwise be ranked, compared and printed as if it were a measurement."""
    for v in values:
        try:
            ok = math.isfinite(float(v))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise NonFiniteResult(f"{what} is {v!r}, not a finite number: the model produced NaN/Inf, so "
                                  f"nothing it measured can be trusted; check the checkpoints' weights")


def check_loopback(host: str) -> str:
    """The workbook only talks to engines on this machine (ones it started, or a /metrics it is pointed at):
    refuse any other host, so a URL typed by mistake never sends a request off the machine."""
    if host == "localhost":
        return host
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"host {host!r} is not a loopback address; use 127.0.0.1")
