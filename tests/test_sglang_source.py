"""Fetching SGLang wheels into the cache and finding model classes in them, without importing sglang."""
from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from helpers.engines.sglang import classes as cl
from helpers.engines.sglang import source as ss
from helpers.rules import conventions, wheels

VERSIONS = ("0.5.9", "0.5.23")


def _fetch_or_skip(version: str) -> ss.SglangSource:
    try:
        return ss.fetch_sglang(version)
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch sglang {version}: {exc}")


@pytest.fixture(scope="module")
def sources() -> dict[str, ss.SglangSource]:
    return {v: _fetch_or_skip(v) for v in VERSIONS}


@pytest.mark.parametrize("version", VERSIONS)
def test_cache_entry_layout(sources, version):
    src = sources[version]
    assert src.version == version and src.origin == "cache"
    assert src.root == ss.cache_root() / version
    assert (src.root / ".complete").is_file()
    assert (src.models_dir / "llama.py").is_file()
    assert list(src.root.glob(f"sglang-{version}.dist-info"))


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv(ss.CACHE_ENV, str(tmp_path))
    assert ss.CACHE_ENV is wheels.CACHE_ENV
    assert ss.cache_root() == tmp_path / "sglang" == wheels.cache_root("sglang")


def test_second_fetch_uses_cache_without_pip(sources, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run for a cached version")

    monkeypatch.setattr(ss, "_pip_download", no_pip)
    assert ss.fetch_sglang("0.5.9").root == sources["0.5.9"].root


def test_record_hashes_match_pristine_files(sources):
    src = sources["0.5.23"]  # never patched by the workbook: 0.5.23 needs no patch
    record = src.record_hashes()
    rel = "sglang/srt/models/llama.py"
    assert record[rel] == ss.sha256_file(src.path(rel))


def test_unknown_version_is_refused_and_writes_nothing(tmp_path):
    cache = tmp_path / "cache"
    try:
        with pytest.raises(ss.UnknownVersionError, match=r"0\.0\.1"):
            ss.fetch_sglang("0.0.1", cache=cache)
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable: {exc}")
    assert not (cache / "0.0.1").exists()
    assert not cache.exists() or not any(cache.iterdir())


def _fake_pip(outputs):
    """Stand-in for `pip download` that fails with the given outputs, one per call."""
    calls = []

    def run(version, dest, extra=()):
        calls.append(extra)
        text = outputs[min(len(calls), len(outputs)) - 1]
        return subprocess.CompletedProcess(["pip"], 1, "", text)
    return run, calls


_NO_VERSIONS = ("ERROR: Could not find a version that satisfies the requirement sglang==0.5.23 "
                "(from versions: none)\nERROR: No matching distribution found for sglang==0.5.23\n")


def test_empty_version_list_means_unreachable_index(monkeypatch, tmp_path):
    run, calls = _fake_pip([_NO_VERSIONS])
    monkeypatch.setattr(ss, "_pip_download", run)
    with pytest.raises(ss.IndexUnreachableError, match="index is unreachable") as exc:
        ss.fetch_sglang("0.5.23", cache=tmp_path / "cache")
    assert not isinstance(exc.value, ss.UnknownVersionError)
    assert len(calls) == 1  # no wheel-tag retries against an index that did not answer
    assert not (tmp_path / "cache" / "0.5.23").exists()


def test_version_absent_from_a_real_listing_is_unknown(monkeypatch, tmp_path):
    listed = ("ERROR: Could not find a version that satisfies the requirement sglang==0.5.99 "
              "(from versions: 0.5.8, 0.5.9, 0.5.10)\nERROR: No matching distribution found\n")
    run, calls = _fake_pip([listed])
    monkeypatch.setattr(ss, "_pip_download", run)
    with pytest.raises(ss.UnknownVersionError,
                       match=r"0\.5\.99 does not exist .*latest listed: 0\.5\.8, 0\.5\.9, 0\.5\.10"):
        ss.fetch_sglang("0.5.99", cache=tmp_path / "cache")
    # pip lists only versions with a wheel for this Python, so other wheel tags were tried first
    assert len(calls) == 1 + len(wheels.FALLBACK_WHEEL_TAGS)
    assert calls[0] == () and calls[1] == ("--python-version", wheels.FALLBACK_WHEEL_TAGS[0][0],
                                           "--platform", wheels.FALLBACK_WHEEL_TAGS[0][1])


def test_sglang_errors_are_package_source_errors(monkeypatch, tmp_path):
    """``except ss.X`` still catches sglang's failures, and ``except PackageSourceError`` catches any."""
    assert issubclass(ss.UnknownVersionError, wheels.UnknownPackageVersion)
    assert issubclass(ss.IndexUnreachableError, wheels.PackageIndexUnreachable)
    assert issubclass(ss.SglangSourceError, wheels.PackageSourceError)
    (tmp_path / "cache" / "0.5.9" / "sglang" / "srt" / "models").mkdir(parents=True)
    (tmp_path / "cache" / "0.5.9" / ".complete").write_text("x.whl\n")
    run, _ = _fake_pip([_NO_VERSIONS])
    monkeypatch.setattr(ss, "_pip_download", run)
    with pytest.raises(wheels.PackageSourceError,
                       match=r"cached here: 0\.5\.9; go online once to fetch it, or point at an sglang tree"):
        ss.fetch_sglang("0.5.23", cache=tmp_path / "cache")


def test_fetch_keeps_srt_sources_and_dist_info_only(monkeypatch, tmp_path):
    members = ["sglang/srt/models/llama.py", "sglang/srt/layers/x.py", "sglang/srt/data.json",
               "sglang/lang/api.py", "sglang-9.9.9.dist-info/RECORD", "sglang-9.9.9.dist-info/METADATA"]

    def pip(version, dest, extra=()):
        with zipfile.ZipFile(dest / f"sglang-{version}-py3-none-any.whl", "w") as zf:
            for name in members:
                zf.writestr(name, "")
        return subprocess.CompletedProcess(["pip"], 0, "", "")

    monkeypatch.setattr(ss, "_pip_download", pip)
    src = ss.fetch_sglang("9.9.9", cache=tmp_path / "cache")
    assert src.root == tmp_path / "cache" / "9.9.9" and src.origin == "cache"
    kept = sorted(p.relative_to(src.root).as_posix() for p in src.root.rglob("*") if p.is_file())
    assert kept == [".complete", "sglang-9.9.9.dist-info/METADATA", "sglang-9.9.9.dist-info/RECORD",
                    "sglang/srt/layers/x.py", "sglang/srt/models/llama.py"]
    monkeypatch.setattr(ss, "_pip_download", lambda *a, **k: pytest.fail("pip called"))
    cache = tmp_path / "cache"
    assert ss.cached_sglang("9.9.9", cache) == src == ss.fetch_sglang("9.9.9", cache)


def test_dead_index_url_is_unreachable_not_unknown(monkeypatch, tmp_path):
    """The real pip against a closed local port: no network is needed to see it fail."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    cache = tmp_path / "cache"
    with pytest.raises(ss.IndexUnreachableError, match="sglang 0.5.23.*nothing is cached"):
        ss.fetch_sglang("0.5.23", cache=cache)
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.parametrize("typed, first", [("llama", "LlamaForCausalLM"),
                                          ("deepseek_v3", "DeepseekV3ForCausalLM"),
                                          ("qwen3moe", "Qwen3MoeForCausalLM"),
                                          ("DeepseekV3ForCausalLm", "DeepseekV3ForCausalLM")])
def test_architecture_suggestions(sources, typed, first):
    close = cl.suggest_architectures(sources["0.5.9"], typed)
    assert close and close[0] == first and len(close) <= 6
    with pytest.raises(cl.UnknownArchitectureError, match=f"did you mean {first}"):
        cl.find_model_file(sources["0.5.9"], typed)


def test_inner_model_from_constructor_default_and_class_attribute(sources):
    src = sources["0.5.23"]
    # qwen3_vl.py: `self.model = language_model_cls(...)`, default `language_model_cls=Qwen3LLMModel`
    vl = cl.class_for_arch(src, "Qwen3VLForConditionalGeneration")
    assert cl.child_class(src, vl, "model").name == "Qwen3LLMModel"
    # qwen3_5.py: the subclass declares its own default and hands it to super().__init__
    q35 = cl.class_for_arch(src, "Qwen3_5ForConditionalGeneration")
    assert cl.child_class(src, q35, "model").path.name == "qwen3_5.py"
    # qwen3_5_text.py: `self.model = self.body_cls(...)`, `body_cls = qwen3_5.Qwen3_5ForCausalLM`
    text = cl.class_for_arch(src, "Qwen3_5MoeForCausalLM")
    inner = cl.child_class(src, text, "model")
    assert (inner.name, inner.path.name) == ("Qwen3_5MoeForCausalLM", "qwen3_5.py")


@pytest.mark.parametrize("bad", ["latest", "0.5.9; rm -rf /", "../0.5.9", ""])
def test_malformed_version_never_reaches_pip(bad, monkeypatch):
    monkeypatch.setattr(ss, "_pip_download", lambda *a, **k: pytest.fail("pip called"))
    with pytest.raises(ss.UnknownVersionError):
        ss.fetch_sglang(bad)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("arch, filename", [
    ("DeepseekV3ForCausalLM", "deepseek_v2.py"),
    ("DeepseekV2ForCausalLM", "deepseek_v2.py"),
    ("LlamaForCausalLM", "llama.py"),
    ("Qwen2ForCausalLM", "qwen2.py"),  # EntryClass = Qwen2ForCausalLM (a single name)
    ("Qwen3ForCausalLM", "qwen3.py"),
    ("LlamaForCausalLMEagle3", "llama_eagle3.py"),
])
def test_arch_maps_to_model_file(sources, version, arch, filename):
    src = sources[version]
    path = cl.find_model_file(src, arch)
    assert path.name == filename
    assert arch in cl.entry_class_names(cl.parse_file(path))
    assert cl.class_for_arch(src, arch).path == path


def test_unknown_arch_suggests_close_names(sources):
    with pytest.raises(cl.UnknownArchitectureError, match="DeepseekV3ForCausalLM"):
        cl.find_model_file(sources["0.5.9"], "DeepseekV3ForCausalLm")


def test_inherited_setter_is_found_on_the_base_class(sources):
    src = sources["0.5.9"]
    v3 = cl.class_for_arch(src, "DeepseekV3ForCausalLM")
    owner, fn = cl.find_method(src, v3, "set_eagle3_layers_to_capture")
    assert owner.name == "DeepseekV2ForCausalLM"
    assert src.path(src.rel(owner.path)).read_text().splitlines()[fn.lineno - 1].strip().startswith(
        "def set_eagle3_layers_to_capture")


def test_base_class_in_another_file_is_followed(sources):
    src = sources["0.5.9"]
    qwen3 = cl.class_for_arch(src, "Qwen3ForCausalLM")
    model = cl.child_class(src, qwen3, "model")
    assert model.name == "Qwen3Model"
    owner, _ = cl.find_method(src, model, "forward")
    assert owner.name == "Qwen2Model" and owner.path.name == "qwen2.py"


def test_factory_method_child_is_resolved(sources):
    # LlamaForCausalLM builds self.model through self._init_model(...)
    src = sources["0.5.9"]
    llama = cl.class_for_arch(src, "LlamaForCausalLM")
    assert cl.child_class(src, llama, "model").name == "LlamaModel"


def test_wrapper_hands_setter_to_language_model(sources):
    src = sources["0.5.23"]
    kimi = cl.class_for_arch(src, "KimiK25ForConditionalGeneration")
    assert cl.wrapped_attr(src, kimi) == "language_model"
    assert cl.child_class(src, kimi, "language_model").name == "DeepseekV3ForCausalLM"


def test_entry_class_single_name_and_list(tmp_path):
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "one.py").write_text("class Foo:\n    pass\n\nEntryClass = Foo\n")
    (models / "two.py").write_text("class A:\n    pass\n\nclass B(A):\n    pass\n\nEntryClass = [A, B]\n")
    (tmp_path / "sglang-9.9.9.dist-info").mkdir()
    src = ss.source_at(tmp_path)
    assert src.version == "9.9.9"
    assert cl.entry_class_index(src) == {"Foo": models / "one.py", "A": models / "two.py",
                                         "B": models / "two.py"}
    assert cl.find_model_file(src, "B").name == "two.py"


def test_source_at_needs_an_sglang_folder(tmp_path):
    with pytest.raises(ss.SglangSourceError, match="no sglang"):
        ss.source_at(tmp_path)


def test_parse_engine():
    assert conventions.parse_engine("sglang==0.5.9") == conventions.Engine("sglang", "0.5.9")
    assert conventions.parse_engine("vllm") == conventions.Engine("vllm")
    with pytest.raises(ValueError, match="unknown engine"):
        conventions.parse_engine("tgi")


def test_sglang_is_never_imported(sources):
    ss.installed_sglang()
    cl.class_for_arch(sources["0.5.23"], "LlamaForCausalLM")
    assert "sglang" not in sys.modules
