"""Service settings: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from service.settings import FIELDS, SettingsError, load


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


@pytest.mark.parametrize(("env", "expected"), [
    ({}, {}),
    ({"VLFLEET_PRECISION": "f32", "VLFLEET_THREADS": "2"}, {"INFERENCE_PRECISION_HINT": "f32",
                                                           "INFERENCE_NUM_THREADS": 2}),
    ({"VLFLEET_LM_PRECISION": "f32"}, {"MODEL_PROPERTIES": LM_F32}),
    ({"VLFLEET_PRECISION": "bf16", "VLFLEET_LM_PRECISION": "f32"}, {"INFERENCE_PRECISION_HINT": "bf16",
                                                                   "MODEL_PROPERTIES": LM_F32}),
])
def test_openvino_properties_come_from_the_settings(env, expected):
    from service.engine import pipeline_properties

    assert pipeline_properties(load({"VLFLEET_MODEL_DIR": "/m", **env})) == expected


def test_bad_precision_names_the_choices():
    with pytest.raises(SettingsError, match=r"VLFLEET_PRECISION='fp8' is not valid: expected auto, bf16 or f32"):
        load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_PRECISION": "fp8"})
