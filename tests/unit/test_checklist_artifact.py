"""SVC-READYZ's expected artifact: the OpenVINO one, or for the llamacpp engine the GGUF one the env names."""

from __future__ import annotations

import json

from ops.preflight.test_checklist import served_artifact

OPENVINO = {"artifact_id": "ov1", "dir": "/opt/vlfleet/models/ov1", "bytes": 1}


def test_the_llamacpp_engine_is_held_to_the_gguf_artifact_the_env_names():
    facts = {"gguf_manifest": json.dumps({"artifact_id": "gg1"})}
    assert served_artifact(facts, OPENVINO, "llamacpp") == ("gg1", "VLFLEET_LLAMACPP_MODEL_DIR")
    assert served_artifact(facts, OPENVINO, "direct") == ("ov1", "VLFLEET_MODEL_DIR")
    # no GGUF artifact named: the llamacpp engine serves VLFLEET_MODEL_DIR itself
    assert served_artifact({"gguf_manifest": ""}, OPENVINO, "llamacpp") == ("ov1", "VLFLEET_MODEL_DIR")
    assert served_artifact({"gguf_manifest": "{broken"}, OPENVINO, "llamacpp") == (None, "VLFLEET_LLAMACPP_MODEL_DIR")
