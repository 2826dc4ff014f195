"""Service settings: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from service.runtime.settings import FIELDS, SettingsError, load


def test_defaults_are_safe():
    s = load({"VLFLEET_MODEL_DIR": "/m"})
    assert s.host == "127.0.0.1"  # loopback: nginx is the public entry
    assert s.max_tokens == 128 and s.image_max_side == 448
    assert s.image_url_domains == ()


def test_values_are_parsed():
    s = load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_PORT": "9000", "VLFLEET_WARMUP": "off",
              "VLFLEET_IMAGE_URL_DOMAINS": "Example.com, images.test"})
    assert s.port == 9000 and s.warmup is False
    assert s.image_url_domains == ("example.com", "images.test")


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.env)
def test_every_field_documents_itself(field):
    assert field.env.startswith("VLFLEET_") and field.help.endswith(".") and field.accepts


def test_error_names_variable_and_allowed_values():
    with pytest.raises(SettingsError, match=r"VLFLEET_DEVICE='GPU' is not valid: expected CPU"):
        load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_DEVICE": "GPU"})


LM_F32 = {"language_model": {"INFERENCE_PRECISION_HINT": "f32"}}


def _auto_lm() -> dict:
    """What the default gives on this machine's CPU: the language model on f32 where it has bf16 and VNNI."""
    from service.engine.genai import BF16, VNNI, cpu_flags

    flags = cpu_flags()
    return {"MODEL_PROPERTIES": LM_F32} if flags & set(BF16) and flags & set(VNNI) else {}


def _auto_dq() -> dict:
    """The default dynamic-quantisation group on this machine's CPU: 128 where it has VNNI."""
    from service.engine.genai import VNNI, cpu_flags

    return {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 128} if cpu_flags() & set(VNNI) else {}


@pytest.mark.parametrize(("env", "expected"), [
    ({}, _auto_lm()),
    ({"VLFLEET_PRECISION": "bf16"}, {"INFERENCE_PRECISION_HINT": "bf16"}),  # an explicit precision wins
    ({"VLFLEET_PRECISION": "f32", "VLFLEET_THREADS": "2"}, {"INFERENCE_PRECISION_HINT": "f32",
                                                           "INFERENCE_NUM_THREADS": 2}),
    ({"VLFLEET_LM_PRECISION": "f32"}, {"MODEL_PROPERTIES": LM_F32}),
    ({"VLFLEET_PRECISION": "bf16", "VLFLEET_LM_PRECISION": "f32"}, {"INFERENCE_PRECISION_HINT": "bf16",
                                                                   "MODEL_PROPERTIES": LM_F32}),
])
def test_openvino_properties_come_from_the_settings(env, expected):
    from service.engine import pipeline_properties

    assert pipeline_properties(load({"VLFLEET_MODEL_DIR": "/m", **env})) == {**_auto_dq(), **expected}


AVX2 = {"avx2", "fma", "f16c"}
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
AMX = AVX512_BF16 | {"amx_tile", "amx_int8", "amx_bf16"}


@pytest.mark.parametrize(("setting", "precision", "flags", "expected"), [
    ("auto", "auto", AVX2, None),  # no bf16: the plugin computes in f32 already
    ("auto", "auto", AVX2 | {"avx512f", "avx512_vnni"}, None),  # AVX-512 VNNI without bf16: f32 already
    ("auto", "auto", AVX512_BF16, "f32"),
    ("auto", "auto", AMX, "f32"),
    ("auto", "bf16", AVX512_BF16, None),  # the operator asked for bf16 everywhere
    ("bf16", "auto", AVX512_BF16, "bf16"),
    ("f32", "auto", AVX2, "f32"),
])
def test_language_model_precision_follows_the_cpu(setting, precision, flags, expected):
    from service.engine.genai import lm_precision

    assert lm_precision(setting, precision, flags) == expected


@pytest.mark.parametrize(("env", "language_model"), [
    ({}, None),  # AVX2 only: nothing of the language model's own
    ({"VLFLEET_KV_PRECISION": "f16"}, {"KV_CACHE_PRECISION": "f16"}),
    ({"VLFLEET_KV_PRECISION": "u8", "VLFLEET_LM_PRECISION": "f32"},
     {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"}),
])
def test_language_model_properties(env, language_model, monkeypatch):
    from service.engine import genai
    from service.runtime.settings import load

    monkeypatch.setattr(genai, "cpu_flags", lambda: AVX2)
    props = genai.pipeline_properties(load({"VLFLEET_MODEL_DIR": "/m", **env}))
    assert props.get("MODEL_PROPERTIES", {}).get("language_model") == language_model


@pytest.mark.parametrize(("setting", "flags", "expected"), [
    ("auto", AVX2, None),  # no VNNI: the plugin's own default
    ("auto", AVX512_BF16, 128),
    ("auto", AMX, 128),
    ("0", AVX512_BF16, 0),
    ("32", AVX2, 32),
])
def test_dynamic_quantisation_group_follows_the_cpu(setting, flags, expected, monkeypatch):
    from service.engine import genai
    from service.runtime.settings import load

    monkeypatch.setattr(genai, "cpu_flags", lambda: flags)
    props = genai.pipeline_properties(load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_DQ_GROUP_SIZE": setting}))
    assert props.get("DYNAMIC_QUANTIZATION_GROUP_SIZE") == expected


def test_kv_precision_refuses_what_the_plugin_does_not_take():
    from service.runtime.settings import SettingsError, load

    with pytest.raises(SettingsError, match="VLFLEET_KV_PRECISION"):
        load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_KV_PRECISION": "int4"})


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    from service.engine.genai import cpu_flags

    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nflags\t\t: fpu\n")
    assert cpu_flags(tmp_path / "cpuinfo") == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_bad_precision_names_the_choices():
    with pytest.raises(SettingsError, match=r"VLFLEET_PRECISION='fp8' is not valid: expected auto, bf16 or f32"):
        load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_PRECISION": "fp8"})
