"""Fetching SGLang wheels into the cache and finding model classes in them, without importing sglang."""
from __future__ import annotations

import sys

import pytest

from helpers import sglang_source as ss

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
    assert ss.cache_root() == tmp_path / "sglang"


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
    path = ss.find_model_file(src, arch)
    assert path.name == filename
    assert arch in ss.entry_class_names(ss.parse_file(path))
    assert ss.class_for_arch(src, arch).path == path


def test_unknown_arch_suggests_close_names(sources):
    with pytest.raises(ss.UnknownArchitectureError, match="DeepseekV3ForCausalLM"):
        ss.find_model_file(sources["0.5.9"], "DeepseekV3ForCausalLm")


def test_inherited_setter_is_found_on_the_base_class(sources):
    src = sources["0.5.9"]
    v3 = ss.class_for_arch(src, "DeepseekV3ForCausalLM")
    owner, fn = ss.find_method(src, v3, "set_eagle3_layers_to_capture")
    assert owner.name == "DeepseekV2ForCausalLM"
    assert src.path(src.rel(owner.path)).read_text().splitlines()[fn.lineno - 1].strip().startswith(
        "def set_eagle3_layers_to_capture")


def test_base_class_in_another_file_is_followed(sources):
    src = sources["0.5.9"]
    qwen3 = ss.class_for_arch(src, "Qwen3ForCausalLM")
    model = ss.child_class(src, qwen3, "model")
    assert model.name == "Qwen3Model"
    owner, _ = ss.find_method(src, model, "forward")
    assert owner.name == "Qwen2Model" and owner.path.name == "qwen2.py"


def test_factory_method_child_is_resolved(sources):
    # LlamaForCausalLM builds self.model through self._init_model(...)
    src = sources["0.5.9"]
    llama = ss.class_for_arch(src, "LlamaForCausalLM")
    assert ss.child_class(src, llama, "model").name == "LlamaModel"


def test_wrapper_hands_setter_to_language_model(sources):
    src = sources["0.5.23"]
    kimi = ss.class_for_arch(src, "KimiK25ForConditionalGeneration")
    assert ss.wrapped_attr(src, kimi) == "language_model"
    assert ss.child_class(src, kimi, "language_model").name == "DeepseekV3ForCausalLM"


def test_entry_class_single_name_and_list(tmp_path):
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "one.py").write_text("class Foo:\n    pass\n\nEntryClass = Foo\n")
    (models / "two.py").write_text("class A:\n    pass\n\nclass B(A):\n    pass\n\nEntryClass = [A, B]\n")
    (tmp_path / "sglang-9.9.9.dist-info").mkdir()
    src = ss.source_at(tmp_path)
    assert src.version == "9.9.9"
    assert ss.entry_class_index(src) == {"Foo": models / "one.py", "A": models / "two.py",
                                         "B": models / "two.py"}
    assert ss.find_model_file(src, "B").name == "two.py"


def test_source_at_needs_an_sglang_folder(tmp_path):
    with pytest.raises(ss.SglangSourceError, match="no sglang"):
        ss.source_at(tmp_path)


def test_parse_engine():
    assert ss.parse_engine("sglang==0.5.9") == ("sglang", "0.5.9")
    assert ss.parse_engine("vllm") == ("vllm", None)
    with pytest.raises(ValueError, match="unknown engine"):
        ss.parse_engine("tgi")


def test_sglang_is_never_imported(sources):
    ss.installed_sglang()
    ss.class_for_arch(sources["0.5.23"], "LlamaForCausalLM")
    assert "sglang" not in sys.modules
