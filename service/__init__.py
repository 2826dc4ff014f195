"""vlfleet host side: the inference service (Flask + SSE on OpenVINO GenAI) and its launcher."""

__version__ = "0.1.0"
