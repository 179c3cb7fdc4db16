"""The plugin entry point: registered with vLLM, idempotent, strict about the vLLM version."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from vllm_lookahead import SUPPORTED_VLLM_VERSION, plugin


def test_entry_point_is_declared():
    eps = md.entry_points(group="vllm.general_plugins")
    assert "vllm_lookahead.plugin:register" in {ep.value for ep in eps}


def test_register_is_idempotent():
    plugin.register()
    plugin.register()
    assert plugin._registered


def test_installed_vllm_is_supported():
    assert plugin.installed_vllm_version() == SUPPORTED_VLLM_VERSION
    assert plugin.version_supported()


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0", "1.0.0+cpu", ""])
def test_other_versions_are_not_supported(version, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", version)
    assert not plugin.version_supported()


def test_local_tag_is_ignored(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", SUPPORTED_VLLM_VERSION + "+cpu")
    assert plugin.installed_vllm_version() == SUPPORTED_VLLM_VERSION and plugin.version_supported()


def test_other_version_leaves_vllm_untouched(monkeypatch, caplog):
    from vllm_lookahead.glue import patches

    patches.revert_all()
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "installed_vllm_version", lambda: "0.33.0")
    try:
        with caplog.at_level("WARNING", logger="vllm_lookahead"):
            plugin.register()
        assert patches.applied() == []
        assert "plugin stays inert" in caplog.text
    finally:
        patches.apply_all()


def test_vllm_console_script_metadata():
    # cpu_fixups writes a `vllm` distribution alias versioned X+cpu, which the `vllm` command needs.
    assert "cpu" in md.version("vllm") or md.version("vllm") == SUPPORTED_VLLM_VERSION
