"""The engine guard on an SGLang release without a plugin framework (before ``sglang.srt.plugins``): put this
folder (no ``sgl_kernel`` here, nothing of the CPU accommodations) on the server's PYTHONPATH and every
process of the launch installs the model-registry hooks (``helpers.engines.sglang.hooks``) at start. Releases
with the framework load ``helpers.engines.sglang.plugin`` through the installed entry point instead."""
import os

if os.environ.get("EAGLE3_WORKBOOK_GUARD", "off").strip().lower() not in ("", "off") or any(
        os.environ.get(k) for k in ("EAGLE3_WORKBOOK_SGLANG_REPORT", "EAGLE3_WORKBOOK_SGLANG_CAPTURE_RULE",
                                    "EAGLE3_WORKBOOK_SGLANG_PROBE_DIR")):
    from helpers.engines.sglang import plugin

    plugin.register()
